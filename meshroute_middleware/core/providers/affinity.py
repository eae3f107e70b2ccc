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
  that route unless another route is better by more than the cache saves (`keeps`), and that
  key even when its order would now start elsewhere (it moved off a cooling key, whose cache
  is cold). The memory is the process's own; the conversations it moved off their first key
  (`moves`) go to its gossip peers (the other `--workers` too: gossiped.py), which take the
  newer of theirs and that word (`recall`'s `told`).
- What a cache hit saves is learned per provider route (`FirstBytes`): its first-byte time
  against the prompt's tokens the provider did not read from its cache (the prompt less the
  `cached_tokens` it reported), fitted by the rule that learns a mesh route's cold prefill
  (core/policies/prefill.py: a decayed least-squares fit, base + slope x uncached tokens).
  The slope is what each cached token saves; until a route's own turns tell it, it is
  shrunk toward PRIOR_SAVING_S_PER_KTOK.
- Why a warm conversation kept or left its key (`Verdict`) goes on its trace
  (`meshroute.affinity`, docs/observability.md).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Iterable
from functools import lru_cache
from typing import TYPE_CHECKING, Final, NamedTuple

from ..policies.prefill import KILO, PrefillFit

if TYPE_CHECKING:  # config.py imports this module, and chain.py and keys.py import config.py
    from .chain import Candidate
    from .keys import KeyGates

DEFAULT_CACHE_TTL_S = 300.0  # OpenAI's and Anthropic's default prompt-cache lifetime: 5 min
MAX_CONVERSATIONS = 16_384  # remembered at most (least recently served dropped first)
MAX_MOVED = 1024  # conversations off their first key told to peers (least recent out)
# What a cached prompt token saves in first-byte time before a route's own turns say:
# 0.05 s per 1,000 tokens, the lower of Anthropic's published examples (prompt caching's
# announcement, Aug 2024: a 10,000-token prompt 1.6 -> 1.1 s, a 100,000-token one
# 11.5 -> 2.4 s, i.e. 0.05 and 0.09 s per 1,000 cached tokens).
PRIOR_SAVING_S_PER_KTOK: Final = 0.05
# The prior's weight in a route's fit, in samples' worth (PrefillModel's ROUTE_PRIOR): a
# route's own warm and cold turns outweigh it after a few of each.
SAVING_PRIOR_SAMPLES: Final = 2.0
MAX_ROUTES: Final = 4096  # provider routes whose first bytes are learned (config-bounded)
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
    seed = _mix(conversation ^ _route_hash(route))
    return tuple(sorted(range(1, keys + 1), key=lambda k: _mix(seed ^ k), reverse=True))


@lru_cache(maxsize=MAX_ROUTES)
def _route_hash(route: str) -> int:
    """A route's FNV-1a, once per route (every turn's key order and record ask it)."""
    return _fnv1a(route.encode())


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


def keeps(held_score: float | None, best_other: float | None) -> bool:
    """Whether a warm route keeps its conversation: its expected score with the cache's
    savings (first-byte time and price) priced in is at least every other route's."""
    if held_score is None or best_other is None:
        return True
    return held_score >= best_other


class Verdict:
    """What affinity did for a conversation's turn (the trace's `meshroute.affinity`)."""

    KEPT: Final = "kept"  # the warm route and key took the turn
    NEW: Final = "new"  # nothing remembered: its first turn (or forgotten, least recent out)
    EXPIRED: Final = "expired"  # remembered, but longer ago than its provider's cache_ttl
    COOLING: Final = "cooling"  # the warm key is cooling (a 429)
    REVOKED: Final = "revoked"  # the warm key was refused (401/403)
    LIMITS: Final = "limits"  # the warm key is over rpm/rpd/tpm/tpd or its budget
    WORSE: Final = "worse"  # another route is better by more than the cache saves
    FAILED: Final = "failed"  # the warm key's attempt failed in this request (5xx, timeout)
    PINNED: Final = "pinned"  # the request's pin, or its session's route, went first
    UNFIT: Final = "unfit"  # the warm route cannot take this turn (context, capabilities)


def refused_verdict(reason: str) -> str:
    """The verdict of a warm key the gates (or its attempt) refused for `reason`."""
    if reason in ("cooldown", "http_429"):
        return Verdict.COOLING
    if reason in ("revoked", "http_401", "http_403"):
        return Verdict.REVOKED
    if reason in ("rpm", "rpd", "tpm", "tpd", "budget"):
        return Verdict.LIMITS
    if reason in ("context", "capability"):
        return Verdict.UNFIT
    return Verdict.FAILED


def warm_refused(gates: KeyGates, held: Held, candidates: Iterable[Candidate], tokens: int,
                 now: float) -> str | None:
    """Why the warm key cannot take a turn of `tokens` now (a Verdict); None when it can."""
    c = next((c for c in candidates if c.route == held.route), None)
    if c is None or c.provider is None or c.model is None or held.key > len(c.provider.keys) \
            or (c.context is not None and tokens > c.context):
        return Verdict.UNFIT
    refusal = gates.check(c.provider, c.model, held.key, tokens, now)
    return None if refusal is None else refused_verdict(refusal.reason)


class FirstBytes:
    """Per provider route: first-byte seconds against the prompt's uncached kilotokens, a
    decayed least-squares fit (core/policies/prefill.py `PrefillFit`, the mesh's rule), its
    slope shrunk toward PRIOR_SAVING_S_PER_KTOK and its base toward the route's mean."""

    def __init__(self, max_routes: int = MAX_ROUTES) -> None:
        self.max_routes = max_routes
        self._fits: dict[str, PrefillFit] = {}
        self._solved: dict[str, tuple[int, tuple[float, float]]] = {}  # per sample count

    def add(self, route: str, prompt_tokens: int, cached_tokens: int, ttfb_ms: float) -> None:
        """One answered turn: its prompt, the part the provider read from its cache (0 when
        it said none) and its first-byte time."""
        if prompt_tokens <= 0 or not 0.0 <= ttfb_ms < float("inf"):
            return
        fit = self._fits.get(route)
        if fit is None:
            if len(self._fits) >= self.max_routes:
                return
            fit = self._fits[route] = PrefillFit()
        fit.add(max(prompt_tokens - max(cached_tokens, 0), 0), ttfb_ms / 1000.0)

    def fit(self, route: str) -> tuple[float, float] | None:
        """(base seconds, seconds saved per cached kilotoken) of a route; None before its
        first sample."""
        fit = self._fits.get(route)
        if fit is None or fit.s0 <= 0.0:
            return None
        solved = self._solved.get(route)
        if solved is None or solved[0] != fit.samples:
            solved = (fit.samples, fit.solve(fit.sy / fit.s0, PRIOR_SAVING_S_PER_KTOK,
                                             SAVING_PRIOR_SAMPLES))
            self._solved[route] = solved
        return solved[1]

    def saving_s(self, route: str, warm_tokens: int) -> float:
        """Seconds a turn whose `warm_tokens` the route's cache holds saves on its first byte."""
        fit = self.fit(route)
        slope = PRIOR_SAVING_S_PER_KTOK if fit is None else fit[1]
        return slope * max(warm_tokens, 0) / KILO

    def expected_ms(self, route: str, ttfb_ms: float | None, prompt_tokens: int,
                    warm_tokens: int) -> float | None:
        """A turn's expected first-byte milliseconds on the route: by its fit at the prompt's
        uncached tokens; before it has one, its measured mean (`ttfb_ms`) less the prior's
        saving; None when neither is known."""
        fit = self.fit(route)
        if fit is None:
            if ttfb_ms is None:
                return None
            return max(ttfb_ms - 1000.0 * self.saving_s(route, warm_tokens), 0.0)
        base, slope = fit
        return 1000.0 * max(base + slope * max(prompt_tokens - warm_tokens, 0) / KILO, 0.0)


class Affinity:
    """Which route and key served each conversation last (bounded, least recent out)."""

    def __init__(self, max_entries: int = MAX_CONVERSATIONS) -> None:
        self.max_entries = max_entries
        self._held: OrderedDict[int, Held] = OrderedDict()
        # conversations served off their key order's first key (and their later turns):
        # what the other workers and trackers are told (gossiped.py), as no order says it
        self._moved: OrderedDict[int, Held] = OrderedDict()

    def __len__(self) -> int:
        return len(self._held)

    def warm(self, turn: Turn | None, now: float) -> Held | None:
        """Where the conversation was served within its provider's `cache_ttl`; None when
        never, or longer ago (then forgotten)."""
        return self.recall(turn, now)[0]

    def recall(self, turn: Turn | None, now: float,
               told: Held | None = None) -> tuple[Held | None, str | None]:
        """`warm`, and when it is None why: Verdict.NEW or EXPIRED (None: no conversation).
        `told`: where a peer served it last off its first key, taken when newer and warm."""
        if turn is None:
            return None, None
        held = self._held.get(turn.conversation)
        if told is not None and now - told.at <= told.ttl_s and (
                held is None or told.at > held.at):
            return told, None
        if held is None:
            return None, Verdict.NEW
        if now - held.at > held.ttl_s:
            del self._held[turn.conversation]
            return None, Verdict.EXPIRED
        return held, None

    def moves(self, now: float) -> dict[int, Held]:
        """The conversations served off their first key that are still warm."""
        while self._moved and now - (old := next(iter(self._moved.values()))).at > old.ttl_s:
            self._moved.popitem(last=False)  # the least recent first: cold now
        return {c: h for c, h in self._moved.items() if now - h.at <= h.ttl_s}

    def served(self, turn: Turn | None, route: str, key: int, now: float,
               ttl_s: float = DEFAULT_CACHE_TTL_S, moved: bool = False) -> None:
        """A provider key answered the conversation's turn now (`ttl_s`: its `cache_ttl`;
        `moved`: the key is not its order's first, or a peer said it had been moved)."""
        if turn is None or ttl_s <= 0:
            return
        conversation = turn.conversation
        held = self._held[conversation] = Held(route, key, now, turn.prompt_tokens, ttl_s)
        self._held.move_to_end(conversation)
        while len(self._held) > self.max_entries:
            self._held.popitem(last=False)
        if moved or conversation in self._moved:
            self._moved[conversation] = held
            self._moved.move_to_end(conversation)
            while len(self._moved) > MAX_MOVED:
                self._moved.popitem(last=False)
