"""An asyncio loop on virtual time, for tests that time first bytes without a wall clock: when
nothing is ready to run, its clock jumps to the next timer, so `asyncio.sleep(2)` takes no
real time and a loaded machine cannot move the result (tests/ only)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """Its `time()` starts at 0 and advances only to the next due timer, never by itself."""

    def __init__(self) -> None:
        super().__init__()
        self._now = 0.0

    def time(self) -> float:
        return self._now

    def _run_once(self) -> None:
        scheduled: list[Any] = self._scheduled  # type: ignore[attr-defined]
        if not self._ready and scheduled:  # type: ignore[attr-defined]
            self._now = max(self._now, min(h.when() for h in scheduled if not h.cancelled())
                            if any(not h.cancelled() for h in scheduled) else self._now)
        super()._run_once()  # type: ignore[misc]


def run_virtual(main: Callable[[], Awaitable[T]]) -> T:
    """Run `main()` to its end on a VirtualTimeLoop."""
    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        return runner.run(main())  # type: ignore[arg-type]
