"""First-byte deadlines learned per route (issue 34): a hung route costs about its own worst
normal wait, not the whole `--first-byte-timeout`.

Each route keeps its last WINDOW times to the answer's head; once it has MIN_SAMPLES, an
attempt at it waits at most MARGIN × their QUANTILE, and never less than FLOOR_S. A cold route
(too few samples) has no learned deadline: the forwarder's first-byte timeout holds, which is
also the ceiling of every learned one (the forwarder's own timer runs beside it). A route cut
at its learned deadline forgets its samples, so its next attempt waits the full ceiling: a
route that became slow for good relearns its new normal instead of being cut for ever.
"""

from __future__ import annotations

from collections import deque

from meshroute_middleware.core.hedging import quantile

WINDOW = 64  # the last first-byte times kept per route
MIN_SAMPLES = 10  # fewer: the route is cold and keeps the ceiling
QUANTILE = 0.99
MARGIN = 3.0  # × the route's QUANTILE: room for a loaded moment that is not a hang
FLOOR_S = 1.0  # no learned deadline is shorter (a route measured at 20 ms still gets 1 s)
REFRESH = 8  # the deadline is recomputed after this many new samples (not per request)


class _Times:
    __slots__ = ("deadline_s", "fresh", "times")

    def __init__(self) -> None:
        self.times: deque[float] = deque(maxlen=WINDOW)
        self.deadline_s: float | None = None
        self.fresh = 0  # samples since the deadline was computed


class FirstByteDeadlines:
    """Per route (a signature, a key route): its learned first-byte deadline."""

    __slots__ = ("_routes",)

    def __init__(self) -> None:
        self._routes: dict[str, _Times] = {}

    def deadline_s(self, route: str) -> float | None:
        """Seconds an attempt at `route` waits for its answer's head; None when the route is
        cold (the forwarder's first-byte timeout holds)."""
        times = self._routes.get(route)
        return None if times is None else times.deadline_s

    def observe(self, route: str, seconds: float) -> None:
        """An attempt at `route` got its answer's head after `seconds`."""
        times = self._routes.get(route)
        if times is None:
            times = self._routes[route] = _Times()
        times.times.append(seconds)
        times.fresh += 1
        if len(times.times) >= MIN_SAMPLES and (times.deadline_s is None
                                                or times.fresh >= REFRESH):
            times.deadline_s = learned_s(times.times)
            times.fresh = 0

    def quantile_s(self, route: str, q: float) -> float | None:
        """The `q` quantile of `route`'s kept times; None while it is cold."""
        times = self._routes.get(route)
        if times is None or len(times.times) < MIN_SAMPLES:
            return None
        return quantile(list(times.times), q)

    def forget(self, route: str) -> None:
        """The route was cut at its learned deadline: cold again (the ceiling holds)."""
        self._routes.pop(route, None)


def learned_s(times: deque[float] | list[float]) -> float:
    """MARGIN × the QUANTILE of `times`, at least FLOOR_S."""
    ordered = sorted(times)
    at = min(len(ordered) - 1, int(QUANTILE * len(ordered)))
    return max(FLOOR_S, MARGIN * ordered[at])
