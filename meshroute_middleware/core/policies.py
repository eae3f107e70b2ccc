"""Selection policies: given the candidate arms of one decision, pick one and say why."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar, NamedTuple, Protocol

from .routes import Route
from .stats import PROVEN, STALE, UNSAMPLED_VIEW, MergedRoute, RouteView

SCOUT, EXPLOIT, PINNED = "scout", "exploit", "pinned"  # ADR-0021 decision modes
GREEDY, FALLBACK = "greedy-fallback", "fallback"


class Arm:
    """One candidate route as a policy sees it at decision time.

    A decision builds one per candidate, and most policies read only a few of them in full:
    the merged view is computed from `merged` on first access, not up front.
    """

    __slots__ = ("_merged", "_now", "_view", "in_flight", "route")

    def __init__(self, route: Route, view: RouteView | None = None, in_flight: int = 0,
                 merged: MergedRoute | None = None, now: float = 0.0) -> None:
        self.route = route
        self.in_flight = in_flight
        self._view = view
        self._merged = merged
        self._now = now

    @property
    def view(self) -> RouteView:
        """The route's merged, decayed statistics at decision time."""
        view = self._view
        if view is None:
            merged = self._merged
            view = self._view = UNSAMPLED_VIEW if merged is None else merged.at(self._now)
        return view

    @property
    def origins(self) -> int:
        """How many trackers' statistics the view merges (no decay needed to tell)."""
        if self._view is not None or self._merged is None:
            return self.view.origins
        return self._merged.origins

    @property
    def stale(self) -> bool:
        """Whether the statistics predate the last topology change (time-independent)."""
        if self._view is not None or self._merged is None:
            return self.view.status == STALE
        return self._merged.stale

    @property
    def signature(self) -> str:
        """The route signature."""
        return self.route.signature

    @property
    def prior_tps(self) -> float:
        """The enumeration prior (bottleneck effective throughput)."""
        return self.route.prior_tps

    @property
    def proven(self) -> bool:
        """Whether the arm is in the exploit pool."""
        return self.view.status == PROVEN

    def __repr__(self) -> str:
        return f"Arm({self.route.signature!r}, {self.view!r}, in_flight={self.in_flight})"


class Outcome(NamedTuple):
    """What one forwarded request showed; `error` is empty on success.

    A NamedTuple (immutable, ~4x cheaper to build than a frozen dataclass): one per attempt.
    """

    completion_tokens: int = 0
    seconds: float = 0.0  # from forwarding to the last byte
    ttfb_s: float = 0.0
    error: str = ""  # "" | "connect" | "timeout" | "http_5xx" | "http_429" | "stream" | ...
    concurrency: float = 0.0  # the route's mean in-flight count while it ran (Router.record)

    @property
    def ok(self) -> bool:
        """Whether the request succeeded."""
        return not self.error


class Policy(Protocol):
    """Chooses among arms; may learn from outcomes. Deterministic given its rng."""

    @property
    def name(self) -> str:
        """The name the policy is selected by (a class or instance attribute will do)."""
        ...

    def choose(self, arms: Sequence[Arm], now: float, rng: random.Random) -> tuple[int, str]:
        """Return (index into arms, mode)."""
        ...

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """Learn from a finished request (most policies read the shared statistics instead)."""
        ...


def best_prior(arms: Sequence[Arm]) -> int:
    """Index of the arm with the highest prior (arms come ranked, so the first on a tie)."""
    best = 0
    for i in range(1, len(arms)):
        if arms[i].route.prior_tps > arms[best].route.prior_tps:
            best = i
    return best


def least_measured(arms: Sequence[Arm], pool: Sequence[int]) -> int:
    """ADR-0021 scout target: least decayed mass first, tie on the higher prior."""
    return min(pool, key=lambda i: (arms[i].view.mass, -arms[i].route.prior_tps, i))


def weighted_index(weights: Sequence[float], rng: random.Random) -> int:
    """Draw an index with probability proportional to its weight."""
    total = sum(weights)
    x = rng.random() * total
    acc = 0.0
    for i, w in enumerate(weights):
        acc += w
        if x < acc:
            return i
    return len(weights) - 1


class Adr0021Policy:
    """ADR-0021 exactly: scout with probability explore_share, else exploit P ∝ tps^alpha."""

    name: ClassVar[str] = "adr0021"

    def __init__(self, explore_share: float = 0.3, weight_alpha: float = 1.0) -> None:
        self.explore_share = explore_share
        self.weight_alpha = weight_alpha

    def choose(self, arms: Sequence[Arm], now: float, rng: random.Random) -> tuple[int, str]:
        """Pick an arm as ADR-0021 does."""
        proven = [i for i, a in enumerate(arms) if a.view.status == PROVEN]
        if not proven:
            return best_prior(arms), GREEDY
        if len(proven) < len(arms) and rng.random() < self.explore_share:
            return least_measured(arms, [i for i, a in enumerate(arms) if not a.proven]), SCOUT
        return proven[weighted_index(self._weights(arms, proven), rng)], EXPLOIT

    def _weights(self, arms: Sequence[Arm], proven: Sequence[int]) -> list[float]:
        """tps^alpha of the proven arms (a floor keeps a zero-tps arm drawable)."""
        alpha = self.weight_alpha
        tps = [max(arms[i].view.tps or 0.0, 1e-9) for i in proven]
        return tps if alpha == 1.0 else [x**alpha for x in tps]

    def shares(self, arms: Sequence[Arm]) -> list[float]:
        """Expected traffic share of each arm under this policy right now."""
        proven = [i for i, a in enumerate(arms) if a.proven]
        out = [0.0] * len(arms)
        if not proven:
            out[best_prior(arms)] = 1.0
            return out
        explore = self.explore_share if len(proven) < len(arms) else 0.0
        if explore:
            out[least_measured(arms, [i for i, a in enumerate(arms) if not a.proven])] = explore
        weights = self._weights(arms, proven)
        total = sum(weights)
        for i, w in zip(proven, weights, strict=True):
            out[i] += (1 - explore) * w / total
        return out

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """ADR-0021 reads only the shared statistics."""
