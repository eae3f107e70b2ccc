"""Provider-key affinity (issue 35): a conversation stays on the provider model and key that
served it while that provider's prompt cache is warm.

A provider caches a prompt's prefix per key (per organisation or project behind it): a turn
that reaches another key pays the whole prompt again. So:

- A conversation is named by one number (`conversation`): the hash of its `x-session-id`, else
  the hash of its prompt through its first message after the system prompt (the chat path
  computes it from the prompt's chain of message hashes, core/prefix.py), which every turn of
  the conversation repeats.
- Its keys on a route are tried in a fixed order (`key_order`, rendezvous hashing of the
  conversation and the route): every worker and every tracker makes the same choice with no
  shared state and no store round trip on the request path, and conversations spread over
  the keys as round-robin spreads requests. A key the gates refuse (cooling, over its
  limits, revoked) is skipped for the next one in that order.
- `Affinity` remembers which route and key served a conversation last, for the provider's
  `cache_ttl` (default 5 min, `DEFAULT_CACHE_TTL_S`): while it is warm the conversation keeps
  that route unless the route is clearly worse (`keeps`), and that key even when its order
  would now start elsewhere (it moved off a cooling key, whose cache is cold). The memory is
  the process's own; with `--workers` another worker falls back to the fixed order.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from typing import NamedTuple

DEFAULT_CACHE_TTL_S = 300.0  # OpenAI's and Anthropic's default prompt-cache lifetime: 5 min
MAX_CONVERSATIONS = 16_384  # remembered at most (least recently served dropped first)
# A warm route keeps its conversation unless its score, with the cache's saving priced in,
# is more than this share below the best route's (the cache's latency saving is not
# measured per provider route: this margin is what the ranking grants it).
CLEARLY_WORSE = 0.15
_TTL = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h)?")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_MASK = (1 << 64) - 1


class Turn(NamedTuple):
    """A request's place in its conversation: who it is and how long its prompt is."""

    conversation: int
    prompt_tokens: int


class Held(NamedTuple):
    """Where a conversation was served last, when, and its prompt's length then."""

    route: str  # the provider model's route, `fastco/big-model`
    key: int  # 1-based key position
    at: float  # when it was served (the clock's seconds)
    tokens: int = 0  # that turn's prompt tokens (estimated): what the cache holds
    ttl_s: float = DEFAULT_CACHE_TTL_S  # its provider's `cache_ttl`

    def warm_share(self, prompt_tokens: int) -> float:
        """The share of a prompt of `prompt_tokens` the cache holds (at most 1)."""
        return min(1.0, self.tokens / prompt_tokens) if prompt_tokens > 0 else 0.0


def parse_ttl(value: object) -> float | None:
    """`cache_ttl`'s seconds: a number of seconds or `"5m"`, `"300s"`, `"1h"`, `"500ms"`
    (0 turns affinity off); None when it is none of those."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value) if value >= 0 else None
    if isinstance(value, str):
        m = _TTL.fullmatch(value.strip())
        if m is not None:
            return float(m.group(1)) * _UNIT_S[m.group(2)]
    return None


def key_order(conversation: int, route: str, keys: int) -> tuple[int, ...]:
    """The conversation's keys (1-based) on `route`, in the order to try them: rendezvous
    (highest random weight) hashing, so removing a key moves only its own conversations.
    Every process computes the same order (no salted `hash()`)."""
    seed = _mix(conversation ^ _fnv1a(route.encode()))
    return tuple(sorted(range(1, keys + 1), key=lambda k: _mix(seed ^ k), reverse=True))


def _fnv1a(data: bytes) -> int:
    """64-bit FNV-1a (Fowler, Noll, Vo)."""
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & _MASK
    return h


def _mix(x: int) -> int:
    """splitmix64's finaliser (Steele, Lea, Flood 2014): 64 well-mixed bits of `x`."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def preferred(order: tuple[int, ...], held: Held | None, route: str) -> tuple[int, ...]:
    """The order with the key that served the conversation on `route` first, while warm."""
    if held is None or held.route != route or held.key not in order:
        return order
    return (held.key, *(k for k in order if k != held.key))


def cache_discount(price_in: float, price_cached_in: float | None,
                   warm_share: float) -> float:
    """The input price a warm turn pays on average: the cached share at the cached price."""
    if price_cached_in is None:
        return price_in
    share = min(1.0, max(0.0, warm_share))
    return price_in * (1.0 - share) + price_cached_in * share


def keeps(held_score: float | None, best_score: float | None) -> bool:
    """Whether a warm route keeps its conversation against the best route's score."""
    if held_score is None or best_score is None:
        return True
    return held_score >= best_score * (1.0 - CLEARLY_WORSE)


class Affinity:
    """Which route and key served each conversation last (bounded, least recent out)."""

    def __init__(self, max_entries: int = MAX_CONVERSATIONS) -> None:
        self.max_entries = max_entries
        self._held: OrderedDict[int, Held] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def warm(self, turn: Turn | None, now: float) -> Held | None:
        """Where the conversation was served within its provider's `cache_ttl`; None when
        never, or longer ago (then forgotten)."""
        if turn is None:
            return None
        held = self._held.get(turn.conversation)
        if held is None:
            return None
        if now - held.at > held.ttl_s:
            del self._held[turn.conversation]
            return None
        return held

    def served(self, turn: Turn | None, route: str, key: int, now: float,
               ttl_s: float = DEFAULT_CACHE_TTL_S) -> None:
        """A provider key answered the conversation's turn now (`ttl_s`: its `cache_ttl`)."""
        if turn is None or ttl_s <= 0:
            return
        conversation = turn.conversation
        self._held[conversation] = Held(route, key, now, turn.prompt_tokens, ttl_s)
        self._held.move_to_end(conversation)
        while len(self._held) > self.max_entries:
            self._held.popitem(last=False)
