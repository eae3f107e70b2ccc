"""The usage of clients without limits, written behind (issue 32, "a key costs little").

A client with no rpm, tpm or budget has nothing to decide when its request comes: it is
admitted without a store transaction, and its usage (its ledger row, its day's and month's
counters) is queued at the request's end. One supervised task flushes the queue every
FLUSH_S in one store transaction, however many requests it holds; a flush the store fails
is retried (backing off up to FLUSH_RETRY_MAX_S), never dropped; a task that died while
rows wait is started again; reading the ledger (`GET /v1/usage`) flushes first; at shutdown
the queue is flushed once more, and what the store still does not take is logged, and lost
with the process.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable

from meshroute_middleware.core.clients_budget import (
    ClientGates,
    Spent,
    rows_of_request,
)
from meshroute_middleware.core.providers.keys import RowName
from meshroute_middleware.state.limits import LimitsStore

log = logging.getLogger("meshroute.clients")
FLUSH_S = 0.05  # how long usage waits to be written: the ledger lags the answer by this
FLUSH_RETRY_MAX_S = 5.0
MAX_BATCH = 1_000  # rows of requests written in one transaction
Record = tuple[str, Spent, float]  # (client, what it used, when it ended)


class LedgerWriter:
    """Records of unlimited clients' requests, written to `store` behind their answers."""

    def __init__(self, store: LimitsStore, make: Callable[[int], ClientGates],
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.store, self._make, self._sleep = store, make, sleep
        self._queue: deque[Record] = deque()
        self._lock = asyncio.Lock()  # one flush at a time: a batch is written once
        self._task: asyncio.Task[None] | None = None
        self.failures = 0  # flushes the store failed

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, client: str, spent: Spent, now: float) -> None:
        """Queue one request's usage; the flusher starts unless it runs."""
        self._queue.append((client, spent, now))
        if self._task is None or self._task.done():
            self._start()

    async def flush(self) -> int:
        """Write what is queued now, in batches, until the store fails one; how many records
        are still queued."""
        async with self._lock:
            while self._queue:
                batch = [self._queue[i] for i in range(min(MAX_BATCH, len(self._queue)))]
                if not await self._written(batch):
                    break
                for _ in batch:
                    self._queue.popleft()
            return len(self._queue)

    async def aclose(self, store: str) -> None:
        """At shutdown: stop the flusher, flush once more, log what is lost."""
        if self._task is not None:
            self._task.cancel()
        left = await self.flush()
        if left:
            log.warning("clients: the usage of %d requests is lost: the limits store (%s) "
                        "did not take it before shutdown", left, store)

    async def _written(self, batch: list[Record]) -> bool:
        rows: dict[RowName, None] = {}
        for client, spent, at in batch:
            rows.update(dict.fromkeys(rows_of_request(client, spent.route, at)))

        def op(gates: ClientGates) -> None:
            for client, spent, at in batch:
                gates.record(client, spent, at)

        try:
            await self.store.transact_with(list(rows), self._make, op, batch[-1][2], 0)
        except Exception as exc:  # the store away, or a bug: kept, retried all the same
            self.failures += 1
            if self.failures == 1 or self.failures % 100 == 0:
                log.warning("clients: writing the usage of %d requests failed (%s); it is "
                            "kept and tried again", len(batch), exc)
            return False
        return True

    async def _run(self) -> None:
        wait = FLUSH_S
        while self._queue:
            await self._sleep(wait)
            wait = FLUSH_S if not await self.flush() else min(2 * wait, FLUSH_RETRY_MAX_S)

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """Supervision: a flusher that died while records wait is started again."""
        if task.cancelled():
            return
        if task.exception() is not None:
            log.error("clients: the usage writer failed", exc_info=task.exception())
        if self._queue:
            self._start()
