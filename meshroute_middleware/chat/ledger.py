"""What clients spent, written behind their answers (issue 32, "a key costs little").

A request's end is queued here, not written at once: for a client with a limit or a budget
its settle (its true usage replacing its reservation, and its ledger row), for a client
without one its record (no reservation was held: its ledger row and its day's and month's
counters). The queue is written in one store transaction however many requests it holds:
by the next admission of a client with limits (it carries up to PIGGYBACK queued entries,
so a tracker's own decisions always see its settles), else by one supervised task every
FLUSH_S. A write the store fails is put back and retried (backing off up to
FLUSH_RETRY_MAX_S), never dropped; a task that died while entries wait is started again;
reading the ledger (`GET /v1/usage`) flushes first; at shutdown the queue is flushed once
more, and what the store still does not take is logged, and lost with the process. A settle
is idempotent (core/clients_budget.py): one written twice changes nothing. On one process's
live gates (state/live_clients.py: no state file, no Redis) nothing is saved by waiting: an
end is written on them at once, and nothing is ever queued.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from typing import TypeVar

from meshroute_middleware.core.clients_budget import (
    Admission,
    ClientGates,
    Spent,
    rows_of_request,
)
from meshroute_middleware.core.providers.keys import RowName
from meshroute_middleware.state.limits import LimitsStore
from meshroute_middleware.state.live_clients import LiveClients

log = logging.getLogger("meshroute.clients")
T = TypeVar("T")
FLUSH_S = 0.05  # how long an end waits to be written when no admission carries it
FLUSH_RETRY_MAX_S = 5.0
MAX_BATCH = 1_000  # entries written in one transaction by the flusher
PIGGYBACK = 16  # entries an admission's transaction carries (its rows stay few)
# (client, its admission: None for a client without limits, what it used, when it ended)
Entry = tuple[str, Admission | None, Spent, float]


def apply(gates: ClientGates, entries: Iterable[Entry]) -> None:
    """Write `entries` on `gates`: settles and records, in order."""
    for client, admission, spent, at in entries:
        if admission is None:
            gates.record(client, spent, at)
        else:
            gates.settle(admission, spent, at)


def rows_of(entries: Iterable[Entry]) -> list[RowName]:
    """The rows writing `entries` reads."""
    rows: dict[RowName, None] = {}
    for client, _, spent, at in entries:
        rows.update(dict.fromkeys(rows_of_request(client, spent.route, at)))
    return list(rows)


class LedgerWriter:
    """Requests' ends, written to `store` behind their answers."""

    def __init__(self, store: LimitsStore, make: Callable[[int], ClientGates],
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.store, self._make, self._sleep = store, make, sleep
        self._queue: deque[Entry] = deque()
        self._lock = asyncio.Lock()  # one flusher's write at a time
        self._task: asyncio.Task[None] | None = None
        self.failures = 0  # writes the store failed
        # one process's clients' gates held live (state/live_clients.py): an end is written
        # on them at once, with no transaction to save and nothing queued
        self.live = store.gates if isinstance(store, LiveClients) else None

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, client: str, admission: Admission | None, spent: Spent,
            now: float) -> None:
        """Queue one request's end; the flusher starts unless it runs. On live gates it is
        written at once instead."""
        if self.live is not None:
            if admission is None:
                self.live.record(client, spent, now)
            else:
                self.live.settle(admission, spent, now)
            return
        self._queue.append((client, admission, spent, now))
        if self._task is None or self._task.done():
            self._start()

    def take(self, most: int = PIGGYBACK) -> list[Entry]:
        """Up to `most` queued entries, out of the queue, for a transaction to carry; it
        gives them `back` if it fails."""
        return [self._queue.popleft() for _ in range(min(most, len(self._queue)))]

    def back(self, entries: list[Entry]) -> None:
        """Entries a failed transaction carried: first in the queue again."""
        self._queue.extendleft(reversed(entries))
        if entries and (self._task is None or self._task.done()):
            self._start()

    async def flush(self) -> int:
        """Write what is queued now, in batches, until the store fails one; how many entries
        are still queued."""
        async with self._lock:
            while self._queue:
                batch = self.take(MAX_BATCH)
                if not await self._written(batch):
                    self.back(batch)
                    break
            return len(self._queue)

    async def aclose(self, store: str) -> None:
        """At shutdown: stop the flusher, flush once more, log what is lost."""
        if self._task is not None:
            self._task.cancel()
        left = await self.flush()
        if left:
            log.warning("clients: the usage of %d requests is lost: the limits store (%s) "
                        "did not take it before shutdown", left, store)

    def failed(self, exc: BaseException | str, entries: int) -> None:
        self.failures += 1
        if self.failures == 1 or self.failures % 100 == 0:
            log.warning("clients: writing the usage of %d requests failed (%s); it is kept "
                        "and tried again", entries, exc)

    async def _written(self, batch: list[Entry]) -> bool:
        try:
            await self.store.transact_with(rows_of(batch), self._make,
                                           lambda g: apply(g, batch), batch[-1][3], 0)
        except Exception as exc:  # the store away, or a bug: kept, retried all the same
            self.failed(exc, len(batch))
            return False
        return True

    async def _run(self) -> None:
        """Flush every FLUSH_S until a wait ends with nothing queued (it waits first: the
        next admission often carries what was queued, and a task per request would cost
        more than the write)."""
        wait = FLUSH_S
        while True:
            await self._sleep(wait)
            if not self._queue:
                return
            wait = FLUSH_S if not await self.flush() else min(2 * wait, FLUSH_RETRY_MAX_S)

    def _start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """Supervision: a flusher that died while entries wait is started again."""
        if task.cancelled():
            return
        if task.exception() is not None:
            log.error("clients: the usage writer failed", exc_info=task.exception())
        if self._queue:
            self._start()
