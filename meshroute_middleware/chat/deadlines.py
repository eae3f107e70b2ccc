"""Deadlines learned per route (issue 34): a hung route costs about its own worst normal wait,
not the whole `--first-byte-timeout` (before the first byte) or `--idle-timeout` (between two
chunks of an answer: `GapDeadlines`, learned from each answer's longest silence).

Each route keeps its last WINDOW times to the answer's head; once it has MIN_SAMPLES, an
attempt at it waits at most MARGIN × their QUANTILE, and never less than FLOOR_S. A cold route
(too few samples) has no learned deadline: the forwarder's first-byte timeout holds, which is
also the ceiling of every learned one (the forwarder's own timer runs beside it). A route cut
at its learned deadline forgets its samples, so its next attempt waits the full ceiling: a
route that became slow for good relearns its new normal instead of being cut for ever.

Mesh routes and provider keys learn their gaps by the one rule (`GapDeadlines`, `Paced`):
forward mode per route signature, a provider call per key route (`fastco/big#2`), each with
its forwarder's idle timeout as the ceiling.

Every table keeps only the routes still in use (`RouteTable`): a route unseen for
LEFT_AFTER_S has left (the mesh or the config) and is dropped, and at most MAX_ROUTES are
kept, so memory stays bounded however many routes come and go.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from typing import Generic, TypeVar

from meshroute_middleware.core.errors import MeshRouteError
from meshroute_middleware.core.learned import (
    FLOOR_S,
    MARGIN,
    MIN_SAMPLES,
    QUANTILE,
    WINDOW,
    learned_s,
    quantile,
)
from meshroute_middleware.forwarding.client import UpstreamResponse

__all__ = ["FLOOR_S", "LEFT_AFTER_S", "MARGIN", "MAX_ROUTES", "MIN_SAMPLES", "QUANTILE",
           "WINDOW", "FirstByteDeadlines", "GapDeadlines", "KeyDeadlines", "LearnedCut", "Paced",
           "RouteTable", "learned_s"]

T = TypeVar("T")
V = TypeVar("V")
REFRESH = 8  # the deadline is recomputed after this many new samples (not per request)
LEFT_AFTER_S = 3600.0  # a route unseen this long has left: its times are dropped
# routes a table keeps at most (~2 KB of times each); past it the least recently seen goes
# cold, which is safe: a cold route waits the ceiling
MAX_ROUTES = 1024


class RouteTable(Generic[V]):
    """What a table learned per route, for the routes still in use: when a new route comes,
    routes unseen for LEFT_AFTER_S are dropped (they left the mesh or the config), and the
    least recently seen while more than MAX_ROUTES remain. `clock`: seconds, monotonic."""

    __slots__ = ("_clock", "_make", "_seen", "_values")

    def __init__(self, make: Callable[[], V],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._make, self._clock = make, clock
        self._values: dict[str, V] = {}
        self._seen: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._values)

    def get(self, route: str) -> V | None:
        """`route`'s entry; None when it has none."""
        return self._values.get(route)

    def seen(self, route: str) -> V:
        """`route`'s entry, made when it is new (dropping the routes that left), seen now."""
        now = self._clock()
        value = self._values.get(route)
        if value is None:
            self._drop_gone(now)
            value = self._values[route] = self._make()
        self._seen[route] = now
        return value

    def pop(self, route: str) -> None:
        """Forget `route`."""
        self._values.pop(route, None)
        self._seen.pop(route, None)

    def _drop_gone(self, now: float) -> None:
        for route in [r for r, at in self._seen.items() if now - at > LEFT_AFTER_S]:
            self.pop(route)
        while len(self._values) >= MAX_ROUTES:
            self.pop(min(self._seen, key=self._seen.__getitem__))


class _Times:
    __slots__ = ("deadline_s", "fresh", "times")

    def __init__(self) -> None:
        self.times: deque[float] = deque(maxlen=WINDOW)
        self.deadline_s: float | None = None
        self.fresh = 0  # samples since the deadline was computed


class FirstByteDeadlines:
    """Per route (a signature, a key route): its learned first-byte deadline."""

    __slots__ = ("_routes",)

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._routes: RouteTable[_Times] = RouteTable(_Times, clock)

    def deadline_s(self, route: str) -> float | None:
        """Seconds an attempt at `route` waits for its answer's head; None when the route is
        cold (the forwarder's first-byte timeout holds)."""
        times = self._routes.get(route)
        return None if times is None else times.deadline_s

    def observe(self, route: str, seconds: float) -> None:
        """An attempt at `route` got its answer's head after `seconds`."""
        times = self._routes.seen(route)
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
        self._routes.pop(route)


class GapDeadlines(FirstByteDeadlines):
    """Per route: the longest silence between two chunks it is allowed, learned as the
    first-byte deadline is (MARGIN × the QUANTILE of each whole answer's longest gap, at
    least FLOOR_S) and only when shorter than `ceiling_s` (the forwarder's idle timeout,
    which holds otherwise). A route cut at it is cold again."""

    __slots__ = ("ceiling_s",)

    def __init__(self, ceiling_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(clock)
        self.ceiling_s = ceiling_s

    def deadline_s(self, route: str) -> float | None:
        learned = super().deadline_s(route)
        if learned is None or (self.ceiling_s is not None and learned >= self.ceiling_s):
            return None
        return learned

    def paced(self, route: str, upstream: UpstreamResponse) -> Paced:
        """`upstream`'s chunks, timed; a warm route's learned gap becomes the response's
        idle timeout (the forwarder's own read timer enforces it: no timer per chunk), and
        `Paced.end()` learns the answer's longest gap, or forgets the route when a stream
        it held broke off."""
        limit = self.deadline_s(route)
        if limit is not None and limit < getattr(upstream, "idle_s", 0.0):
            upstream.idle_s = limit  # type: ignore[attr-defined]  # the forwarders' response
        return Paced(self, route, upstream.chunks().__aiter__(), limit)


class Paced:
    """GapDeadlines.paced's iterator: one small object per open stream and no coroutine of
    its own (tests/chat/test_stream_footprint.py counts them). A gap is timed from one ask
    for a chunk to the next (the wait and the chunk's send), from the second chunk on (the
    first is the first-byte deadline's)."""

    __slots__ = ("asked", "gaps", "last", "limit", "longest", "route", "source")

    def __init__(self, gaps: GapDeadlines, route: str, source: AsyncIterator[bytes],
                 limit: float | None) -> None:
        self.gaps, self.route, self.source, self.limit = gaps, route, source, limit
        self.asked = 0  # chunks asked for so far
        self.last = 0.0  # loop time of the last ask
        self.longest = 0.0

    def __aiter__(self) -> Paced:
        return self

    def __anext__(self) -> Awaitable[bytes]:
        at = asyncio.get_running_loop().time()
        self.asked += 1
        if self.asked > 2 and at - self.last > self.longest:
            self.longest = at - self.last
        self.last = at
        return self.source.__anext__()

    def end(self, error: str) -> None:
        """The relay ended (`error`: how it broke off, "" when whole): a whole answer's
        longest gap is one of the route's samples; a stream held to a learned gap that broke
        off leaves the route cold (the idle timeout holds until it relearns)."""
        if not error:
            if self.asked > 2:
                self.gaps.observe(self.route, self.longest)
        elif self.limit is not None:
            self.gaps.forget(self.route)


class LearnedCut(MeshRouteError, TimeoutError):
    """An attempt cut at its route's learned first-byte deadline: a timeout the chain falls
    over from like any other."""


class KeyDeadlines:
    """Provider keys' first-byte deadlines, learned per key route and per load (issue 34).

    A provider answers later under a burst: a deadline learned while it was idle would cut a
    burst's attempts and turn the provider's own answer (a 429, say) into a timeout. So each
    time is kept with the attempts in flight on the key when it came, and an attempt is cut
    only at a deadline learned under at least the load it meets, counted until the cut
    (`open`): MARGIN × the QUANTILE of those times, never under FLOOR_S nor under the worst
    of them (the key's observed worst case under that load). A load never seen keeps the
    ceiling (the attempt's own budget); a key cut forgets, as mesh routes do."""

    __slots__ = ("_flying", "_times")

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._times: RouteTable[deque[tuple[float, int]]] = RouteTable(
            partial(deque, maxlen=WINDOW), clock)
        self._flying: dict[str, int] = {}  # attempts in flight per key (only while any)

    def deadline_s(self, route: str, load: int) -> float | None:
        """The learned deadline of an attempt at `route` with `load` attempts in flight on
        it; None when fewer than MIN_SAMPLES times were taken under as much load."""
        times = [s for s, at in self._times.get(route) or () if at >= load]
        if len(times) < MIN_SAMPLES:
            return None
        return max(learned_s(times), max(times))

    def observe(self, route: str, seconds: float, load: int) -> None:
        """An attempt at `route` got its answer's head after `seconds`, under `load`."""
        self._times.seen(route).append((seconds, load))

    def forget(self, route: str) -> None:
        """The key was cut at its learned deadline: cold again (the ceiling holds)."""
        self._times.pop(route)

    async def open(self, route: str, opening: Awaitable[T], budget_s: float) -> T:
        """`opening` (an upstream's head), within `budget_s` (TimeoutError past it) and the
        key's learned deadline under the load it met (LearnedCut past it)."""
        loop = asyncio.get_running_loop()
        started = loop.time()
        load = self._flying[route] = self._flying.get(route, 0) + 1
        task = asyncio.ensure_future(opening)
        try:
            while True:
                learned = self.deadline_s(route, load)
                cut = learned is not None and learned < budget_s
                limit = learned if cut and learned is not None else budget_s
                await asyncio.wait({task}, timeout=max(0.0, limit - (loop.time() - started)))
                if task.done():
                    head = task.result()
                    self.observe(route, loop.time() - started, load)
                    return head
                if not cut:
                    raise TimeoutError
                if self._flying[route] <= load:  # the load it was learned under: cut
                    self.forget(route)
                    raise LearnedCut(f"no first byte within the key's learned {limit:.2f} s")
                load = self._flying[route]  # a burst came meanwhile: its deadline, if any
        finally:
            task.cancel()  # (done: no effect) an attempt cut closes its connection
            if self._flying[route] > 1:
                self._flying[route] -= 1
            else:  # none in flight: no entry (a key that left leaves nothing behind)
                del self._flying[route]
