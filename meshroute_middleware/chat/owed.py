"""Settles the limits store did not take, kept and retried until it does (issue 32).

A request's settle (its true usage replacing its reservation, and its ledger row) that fails
is never dropped: it waits here, in order, and one supervised task retries the queue, backing
off from SETTLE_RETRY_FIRST_S to SETTLE_RETRY_MAX_S, until the store takes every one. A settle
is idempotent (core/clients_budget.py), so retrying one that did land changes nothing. At
shutdown the queue is tried once more; what the store still does not take is logged, and lost
with the process.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from meshroute_middleware.core.clients_budget import Admission, Spent

log = logging.getLogger("meshroute.clients")
SETTLE_RETRY_FIRST_S, SETTLE_RETRY_MAX_S = 0.05, 5.0
Settle = Callable[[Admission, Spent], Awaitable[bool]]  # whether the store took it


class OwedSettles:
    """The settles a store failed, retried in order by one task."""

    def __init__(self, settle: Settle,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self._settle, self._sleep = settle, sleep
        self._owed: deque[tuple[Admission, Spent]] = deque()
        self._retrier: asyncio.Task[None] | None = None

    def __len__(self) -> int:
        return len(self._owed)

    def add(self, admission: Admission, spent: Spent) -> None:
        """Owe this settle; the retrier starts unless it runs."""
        self._owed.append((admission, spent))
        if self._retrier is None or self._retrier.done():
            self._retrier = asyncio.get_running_loop().create_task(self._retry())
            self._retrier.add_done_callback(self._retried)

    async def flush(self) -> int:
        """Try the owed settles now, in order, until one fails; how many are still owed."""
        while self._owed and await self._settle(*self._owed[0]):
            self._owed.popleft()
        return len(self._owed)

    async def aclose(self, store: str) -> None:
        """At shutdown: stop retrying, try once more, log what is lost."""
        if self._retrier is not None:
            self._retrier.cancel()
        left = await self.flush()
        if left:
            log.warning("clients: the usage of %d requests is lost: the limits store (%s) "
                        "did not take it before shutdown", left, store)

    async def _retry(self) -> None:
        wait = SETTLE_RETRY_FIRST_S
        while self._owed:
            await self._sleep(wait)
            if await self.flush():
                wait = min(2 * wait, SETTLE_RETRY_MAX_S)
        log.info("clients: every owed settle is recorded")

    def _retried(self, task: asyncio.Task[None]) -> None:
        """Supervision: a retrier that died while settles are owed is started again."""
        if task.cancelled():
            return
        if task.exception() is not None:
            log.error("clients: the settle retrier failed", exc_info=task.exception())
        if self._owed:
            self._retrier = asyncio.get_running_loop().create_task(self._retry())
            self._retrier.add_done_callback(self._retried)
