"""The fixed rules self-hosted routers use for conversations (issue 26's baselines).

- session-sticky: hash the conversation to a route (vLLM production-stack's session
  affinity); rendezvous hashing, so a route leaving moves only its own conversations.
- least-loaded: the route with the fewest requests in flight.
- sglang-cache: SGLang's cache-aware rule: the route holding the longest prefix of the prompt
  when it holds enough of it, unless the load imbalance passes a threshold, then the least
  loaded (its thresholds scaled down to meshes of a few nodes and clients).
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from typing import ClassVar

from .base import EXPLOIT, Arm, DecisionMode, Outcome

# SGLang's defaults are an absolute imbalance of 32 requests and a relative one of 1.5x,
# for fleets of big batches; our meshes run a few to 16 requests per node.
BALANCE_ABS = 4
BALANCE_REL = 1.5
CACHE_THRESHOLD = 0.5  # share of the prompt a route must hold to be preferred for it


def least_loaded(arms: Sequence[Arm]) -> int:
    """The arm with the fewest in flight (the best prior on a tie, arms come ranked)."""
    best = 0
    for i in range(1, len(arms)):
        a, b = arms[i], arms[best]
        if (a.in_flight, -a.route.prior_tps) < (b.in_flight, -b.route.prior_tps):
            best = i
    return best


def _rendezvous(key: int, signature: str) -> bytes:
    return hashlib.blake2b(f"{key}:{signature}".encode(), digest_size=8).digest()


class SessionStickyPolicy:
    """Each conversation (its first message, or its x-session-id) hashed to one route."""

    name: ClassVar[str] = "session-sticky"

    def choose(self, arms: Sequence[Arm], now: float,
               rng: random.Random) -> tuple[int, DecisionMode]:
        """The arm the conversation hashes to (a random one for a request without one)."""
        prefix = arms[0].prefix
        if prefix is None or not prefix.hashes:
            return rng.randrange(len(arms)), EXPLOIT
        key = prefix.session or prefix.hashes[0]
        scores = [_rendezvous(key, a.signature) for a in arms]
        return scores.index(max(scores)), EXPLOIT

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """A fixed rule learns nothing."""


class LeastLoadedPolicy:
    """The route with the fewest requests in flight."""

    name: ClassVar[str] = "least-loaded"

    def choose(self, arms: Sequence[Arm], now: float,
               rng: random.Random) -> tuple[int, DecisionMode]:
        """The least loaded arm."""
        return least_loaded(arms), EXPLOIT

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """A fixed rule learns nothing."""


class CacheAwarePolicy:
    """SGLang's router rule: longest prefix match unless the load is out of balance."""

    name: ClassVar[str] = "sglang-cache"

    def choose(self, arms: Sequence[Arm], now: float,
               rng: random.Random) -> tuple[int, DecisionMode]:
        """Least loaded when imbalanced or no route holds enough; else the warmest."""
        loads = [a.in_flight for a in arms]
        high, low = max(loads), min(loads)
        if high - low > BALANCE_ABS and high > BALANCE_REL * low:
            return least_loaded(arms), EXPLOIT
        prefix = arms[0].prefix
        if prefix is not None and prefix.prompt_tokens > 0:
            warmest = max(range(len(arms)), key=lambda i: arms[i].warm_tokens)
            if arms[warmest].warm_tokens > CACHE_THRESHOLD * prefix.prompt_tokens:
                return warmest, EXPLOIT
        return least_loaded(arms), EXPLOIT

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """A fixed rule learns nothing."""
