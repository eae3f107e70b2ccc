"""One routing decision: the route chosen for a request, its fallback chain (ranked on first
use) and what the router knew of the route when the attempt began."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import chain

from .kinds import DecisionMode
from .objectives import DEFAULT_OBJECTIVE, TTFT, Objective
from .policies import Arm
from .policies.ttft import ttft_rank
from .prefix import Prefix
from .routes import Route
from .stats import RouteView


@dataclass(slots=True)
class Decision:
    """One routing decision: which route serves a request, and why."""

    model: str
    route: Route
    mode: DecisionMode
    attempt: int = 0  # 0 for the first choice, k for the k-th fallback
    _ranked: tuple[Route, ...] = field(default=(), repr=False)  # the fallback chain so far
    _unranked: Sequence[Arm] = field(default=(), repr=False)  # arms still to rank into it
    _open: bool = field(default=False, repr=False)  # counted in flight, not yet ended
    _load0: tuple[float, float] = field(default=(0.0, 0.0), repr=False)  # (area, t) at start
    max_tokens: int | None = None  # the request's bound on its answer, if it set one
    prefix: Prefix | None = None  # the prompt's message chain, if the request carried one
    uncached_tokens: int = -1  # of the prompt, on this route as far as the router knows
    objective: Objective = DEFAULT_OBJECTIVE  # what the request asked to be best at
    ahead: int = -1  # attempts in flight on the route when this one began

    @property
    def signature(self) -> str:
        """The chosen route's signature."""
        return self.route.signature

    def alternatives(self) -> tuple[Route, ...] | Iterator[Route]:
        """The fallback chain's routes in no particular order: whether one of them can do
        something needs no ranking (and a decision with one route has none)."""
        if not self._unranked:
            return self._ranked
        return chain(self._ranked, (a.route for a in self._unranked))

    @property
    def ranked(self) -> tuple[Route, ...]:
        """The fallback chain, best first.

        Ranked on first use: ranking reads every arm's merged view, which a decision that
        succeeds never needs (docs/benchmarks/engine.md).
        """
        if self._unranked:
            rank = ttft_rank if self.objective == TTFT else fallback_rank
            self._ranked = tuple(a.route for a in sorted(self._unranked, key=rank))
            self._unranked = ()
        return self._ranked


def fallback_rank(arm: Arm) -> tuple[int, float]:
    """Fallback order: proven arms by learned tps, then the rest by prior."""
    v: RouteView = arm.view
    if arm.proven and v.tps is not None:
        return (0, -v.tps)
    return (1, -arm.route.prior_tps)


def slot_free(decision: Decision) -> bool:
    """Whether the route's announced slots were not all taken when the attempt began."""
    slots = decision.route.slots
    return slots is not None and 0 <= decision.ahead < slots


def uncached(prefix: Prefix | None, warm_tokens: int) -> int:
    """The prompt's tokens a route is not known to hold (-1 without a prompt)."""
    return -1 if prefix is None else max(prefix.prompt_tokens - warm_tokens, 0)
