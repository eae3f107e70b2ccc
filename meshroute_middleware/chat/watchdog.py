"""Watching requests for a client that leaves, and annotate-mode requests for their deadline.

Most requests to a fast head are over within milliseconds, and a task (or even a timer) per
request costs more than the rest of the middleware's bookkeeping (docs/benchmarks.md: −11 µs
for the timer, and the loop looked up once). So one timer ticks every WATCH_AFTER_S while
requests are under way: a request seen by two sweeps has lasted at least that long and gets a
watcher task reading `receive` for `http.disconnect`, which cancels the task serving it. A
request watched for its deadline instead (annotate mode: the app reads `receive` itself) is
cancelled by the first sweep past its deadline, marked `expired`.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Receive

from meshroute_middleware.chat.attempts import Exchange

WATCH_AFTER_S = 0.02  # start watching for a client that leaves once a request lasts this long


class Watchdog:
    """One per middleware; `watch` a request from the task that serves it, `forget` it after."""

    def __init__(self) -> None:
        self._active: dict[Exchange, bool] = {}  # -> watched for its deadline, not the client
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def watch(self, ex: Exchange, deadline: bool = False) -> asyncio.Task[Any]:
        """Watch a request from the task serving it (for a client that leaves, or with
        `deadline` for its deadline); return that task.

        The loop is looked up once, not per request: asyncio's get_running_loop() makes a
        getpid() system call each time, and current_task(loop) with the loop given does not.
        """
        loop = self._loop
        task = asyncio.current_task(loop) if loop is not None else None
        if loop is None or task is None:  # first request, or a new event loop (tests)
            loop = self._loop = asyncio.get_running_loop()
            self._timer = None
            task = asyncio.current_task(loop)
            assert task is not None
        ex.task = task
        self._active[ex] = deadline
        if self._timer is None:
            self._timer = loop.call_later(WATCH_AFTER_S, self._sweep)
        return task

    def forget(self, ex: Exchange) -> None:
        """The request is over: stop watching it."""
        self._active.pop(ex, None)
        if ex.watcher is not None:
            # Dropped, not just cancelled: the cancelled task keeps its CancelledError, whose
            # traceback holds the watcher's frame and so `ex`; a reference back from `ex`
            # would make a cycle per watched request, left to the (full) garbage collections.
            ex.watcher.cancel()
            ex.watcher = None
        ex.task = None

    def _sweep(self) -> None:
        self._timer = None
        now = self._loop.time() if self._loop is not None else 0.0
        for ex, deadline in self._active.items():
            if deadline:
                if now >= ex.attempts.deadline and not ex.expired and ex.task is not None:
                    ex.expired = True
                    ex.task.cancel()
                continue
            if ex.seen and ex.watcher is None and ex.task is not None:
                ex.watcher = asyncio.ensure_future(_watch_disconnect(ex.receive, ex.task, ex))
            ex.seen = True
        if self._active and self._loop is not None and not self._loop.is_closed():
            self._timer = self._loop.call_later(WATCH_AFTER_S, self._sweep)


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any], ex: Exchange) -> None:
    """Wait for the client to leave, then cancel the task serving it."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            ex.gone = True
            task.cancel()
            return
