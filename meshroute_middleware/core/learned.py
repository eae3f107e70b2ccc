"""The rule of a deadline learned from a route's own times (issue 34), in one place for the
gateway (chat/deadlines.py) and the simulator (core/sim/reliability.py): once a route has
MIN_SAMPLES of its last WINDOW times, its deadline is MARGIN × their QUANTILE, never under
FLOOR_S."""

from __future__ import annotations

from collections.abc import Iterable

WINDOW = 64  # the last times kept per route
MIN_SAMPLES = 10  # fewer: the route is cold and keeps the ceiling
QUANTILE = 0.99
MARGIN = 3.0  # × the route's QUANTILE: room for a loaded moment that is not a hang
FLOOR_S = 1.0  # no learned deadline is shorter (a route measured at 20 ms still gets 1 s)


def quantile(times: Iterable[float], q: float) -> float:
    """The `q` quantile of `times` (nearest rank, not interpolated); `times` not empty."""
    ordered = sorted(times)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def learned_s(times: Iterable[float]) -> float:
    """MARGIN × the QUANTILE of `times`, at least FLOOR_S."""
    return max(FLOOR_S, MARGIN * quantile(times, QUANTILE))
