"""The body deadline (`body_timeout_s`, slowloris: 408) of every request whose body is being
read, kept by one timer per middleware instead of one per request.

A request's body almost always arrives with its head, so a timer per request (asyncio.timeout:
schedule, cancel, a heap entry) cost more than reading the body (docs/benchmarks/
instructions.md). Here a request's task is in a dict only while its body is read; one timer,
armed at the oldest entry's deadline, cancels the tasks still reading past theirs and re-arms
itself at the next one. Every entry has the same timeout, so the dict's insertion order is the
order of the deadlines.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

from meshroute_middleware.http.errors import HttpError


class BodyDeadlines:
    """`with deadlines:` around reading a request's body, in the task serving it: past
    `timeout_s` the read is cancelled and RequestError(408) leaves the block instead."""

    __slots__ = ("_expired", "_loop", "_reading", "_timer", "timeout_s")

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._reading: dict[asyncio.Task[Any], float] = {}  # -> its deadline (loop time)
        self._expired: set[asyncio.Task[Any]] = set()  # cancelled here, not yet told
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __enter__(self) -> None:
        """The current task starts reading a body. The loop is looked up once, not per
        request (get_running_loop() makes a getpid() call each time)."""
        loop = self._loop
        task = asyncio.current_task(loop) if loop is not None else None
        if loop is None or task is None:  # first request, or a new event loop (tests)
            loop = self._loop = asyncio.get_running_loop()
            self._reading.clear()
            self._expired.clear()
            self._timer = None
            task = asyncio.current_task(loop)
            assert task is not None
        deadline = loop.time() + self.timeout_s
        self._reading[task] = deadline
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._sweep)

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        """The body is read (or its reading failed): its deadline goes; a task cancelled
        here (and not by anyone else) gets its 408."""
        task = asyncio.current_task(self._loop)
        self._reading.pop(task, None)  # type: ignore[arg-type]
        if kind is asyncio.CancelledError and task in self._expired:
            self._expired.discard(task)
            if not task.uncancel():
                raise HttpError.REQUEST_TIMEOUT.error(
                    f"the request body did not arrive within {self.timeout_s:g} s") from None

    def _sweep(self) -> None:
        self._timer = None
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        now = loop.time()
        for task, deadline in list(self._reading.items()):
            if deadline > now:  # the oldest one still in time: the others are later
                self._timer = loop.call_at(deadline, self._sweep)
                return
            del self._reading[task]
            if not task.done():
                self._expired.add(task)
                task.cancel()
