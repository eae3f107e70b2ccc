"""What every policy shares: the `Policy` protocol, the `Arm` it chooses among, the `Outcome`
it learns from, and the small rules several policies use."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Literal, NamedTuple, Protocol

from ..contracts.limits import MAX_TPS
from ..kinds import (
    DECAYED,
    EXPLOIT,
    FALLBACK,
    GREEDY,
    PINNED,
    PROVEN,
    SCOUT,
    STALE,
    DecisionMode,
    ErrorKind,
)
from ..prefix import Prefix
from ..routes import Route
from ..stats import UNSAMPLED_VIEW, Curve, MergedRoute, RouteView

__all__ = [
    "EXPLOIT", "FALLBACK", "GREEDY", "PINNED", "SCOUT", "Arm", "DecisionMode", "Outcome", "Policy",
    "best_prior", "least_measured", "measured_tps", "weighted_index",
]


class Arm:
    """One candidate route as a policy sees it at decision time.

    A decision builds one per candidate, and most policies read only a few of them in full:
    the merged view is computed from `merged` on first access, not up front.
    """

    __slots__ = ("_merged", "_now", "_view", "in_flight", "max_tokens", "prefix", "route",
                 "warm_tokens")

    def __init__(self, route: Route, view: RouteView | None = None, in_flight: int = 0,
                 merged: MergedRoute | None = None, now: float = 0.0,
                 max_tokens: int | None = None) -> None:
        self.route = route
        self.in_flight = in_flight
        self._view = view
        self._merged = merged
        self._now = now
        # The request's own bound on its answer (the body's max_tokens), None when it sets
        # none: the same for every arm of one decision. A policy may weigh what trying a
        # route costs by it (a short answer on a slower route costs little).
        self.max_tokens = max_tokens
        # The prompt's message chain when the request carries one (issue 26), and the tokens
        # of its longest prefix this route served (0: cold, as far as the router knows).
        self.prefix: Prefix | None = None
        self.warm_tokens = 0

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
    def curve(self) -> Curve:
        """The origins' merged saturation-curve summaries (stats.MergedRoute.curve), as of
        their newest update; empty when none shares one."""
        return () if self._merged is None else self._merged.curve

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
    error: ErrorKind | Literal[""] = ""  # "" on success
    concurrency: float = 0.0  # the route's mean in-flight count while it ran (Router.record)
    max_tokens: int | None = None  # the request's bound on its answer (Router.record)
    # The prompt's tokens the route was not known to hold cached (Router.record, when the
    # request carried a message chain); -1: no prompt known.
    uncached_tokens: int = -1
    ahead: int = -1  # attempts in flight on the route when this one began (Router.record)
    # Whether a slot its servers announced was free when it began (Router.record): what
    # its first token waited then was a neighbour's compute, not a queue.
    slot_free: bool = False

    @property
    def ok(self) -> bool:
        """Whether the request succeeded."""
        return not self.error

    @property
    def tps(self) -> float | None:
        """End-to-end tokens/s of a success, the one rule every caller uses: tokens over the
        seconds from forwarding to the last byte, capped at limits.MAX_TPS; None for a failure
        or when the seconds are not a positive finite number (NaN/inf would poison the EWMA)."""
        seconds = self.seconds
        if self.error or not (seconds > 0 and math.isfinite(seconds)):
            return None
        return min(self.completion_tokens / seconds, MAX_TPS)


class Policy(Protocol):
    """Chooses among arms; may learn from outcomes. Deterministic given its rng."""

    @property
    def name(self) -> str:
        """The name the policy is selected by (a class or instance attribute will do)."""
        ...

    def choose(self, arms: Sequence[Arm], now: float,
               rng: random.Random) -> tuple[int, DecisionMode]:
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


def measured_tps(arm: Arm) -> float | None:
    """The learned tps of an arm measured under the current topology, else None."""
    v = arm.view
    if v.tps is not None and v.status in (PROVEN, DECAYED):
        return v.tps
    return None
