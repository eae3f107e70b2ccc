"""`FallbackLimits`: the clients' LimitsStore while its store is away (issue 32).

Clients' limits never fail open because of our own store. A transaction the store fails
(down, or busy past its bounds: state/redis_limits.py) is decided here on the rows the store
last gave back, not on empty rows, and kept; when the store answers again, what was decided
meanwhile is written back to it, in order, before anything else, with the limits not checked
again (the request was let in: it counts). So an outage costs at most what each tracker
admits on the rows it last read (docs/providers.md, "Clients: when the store is away"), and
no settle is dropped: a settle the store fails is applied when it is back.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from meshroute_middleware.core.clients_budget import CLIENTS, ClientGates
from meshroute_middleware.core.providers.keys import KeyGates, RowName
from meshroute_middleware.state.limits import (
    G,
    LimitsStore,
    LimitsStoreDown,
    Outcome,
    decide,
    rows_by_section,
)

log = logging.getLogger("meshroute.clients")
T = TypeVar("T")
RETRY_S = 1.0  # a failed store is tried again after this (decisions meanwhile run here)
MAX_OWED = 100_000  # decisions kept for the store; past it the oldest are dropped (logged)


class FallbackLimits:
    """A LimitsStore that decides on the rows last read while `store` fails, and writes those
    decisions back when it answers again."""

    def __init__(self, store: LimitsStore, clock: Callable[[], float] = time.time) -> None:
        self.store, self.clock = store, clock
        self.mode = store.mode
        # a blocking store's transaction has no await inside: a caller cancelled while it
        # waits for the write-back (a task of its own) is cancelled before it, not in it
        self.blocking = store.blocking
        self.up = True
        self.failures = 0  # store transactions that failed
        self.local_decisions = 0  # decisions taken here while the store was away
        self.dropped = 0  # decisions never written back (past MAX_OWED)
        self._seen: dict[RowName, dict[str, Any]] = {}  # clients' rows as last read
        self._owed: deque[tuple[list[RowName], Callable[[Any], Any], float, int]] = deque()
        self._retry_at = -math.inf
        self._replay: asyncio.Task[bool] | None = None  # the one write-back under way

    @property
    def owed(self) -> int:
        """Decisions waiting to be written back to the store."""
        return len(self._owed)

    def transact_now(self, rows: Sequence[RowName], op: Callable[[KeyGates], T], now: float,
                     first_id: int) -> Outcome[T]:
        raise LimitsStoreDown("clients' gates are only used from the event loop")

    async def transact(self, rows: Sequence[RowName], op: Callable[[KeyGates], T],
                       now: float, first_id: int) -> Outcome[T]:
        raise LimitsStoreDown("clients' gates are decided with transact_with")

    async def transact_with(self, rows: Sequence[RowName], make: Callable[[int], G],
                            op: Callable[[G], T], now: float, first_id: int) -> Outcome[T]:
        """In the store (after writing back what is owed to it), else here."""
        if await self._write_back(now):
            try:
                out = await self.store.transact_with(rows, make, op, now, first_id)
            except LimitsStoreDown as exc:
                self._lost(exc, now)
            else:
                self._back()
                self._remember(out.rows)
                return out
        return self._locally(list(rows), make, op, now, first_id)

    async def scan(self, section: str) -> list[dict[str, Any]]:
        return await self.store.scan(section)

    async def usage(self, client: str | None, first_day: int) -> list[dict[str, Any]]:
        """The store's ledger, once what is owed to it is written (LimitsStoreDown if not)."""
        now = self.clock()
        if not await self._write_back(now):
            raise LimitsStoreDown(f"the limits store ({self.mode}) is away; {self.owed} "
                                  "decisions wait to be written back")
        try:
            rows = await self.store.usage(client, first_day)
        except LimitsStoreDown as exc:
            self._lost(exc, now)
            raise
        self._back()
        return rows

    async def heartbeat(self, tracker: str, now: float) -> int:
        return await self.store.heartbeat(tracker, now)

    async def close(self) -> None:
        close = getattr(self.store, "close", None)
        if close is not None:
            await close()

    # -- internals ------------------------------------------------------------------------

    def _locally(self, rows: list[RowName], make: Callable[[int], G], op: Callable[[G], T],
                 now: float, first_id: int) -> Outcome[T]:
        self.local_decisions += 1
        loaded = rows_by_section({r: self._seen[r] for r in rows if r in self._seen})
        result, changed, after = decide(loaded, op, now, first_id, make)
        self._remember(after)
        if any(changed.values()):
            if len(self._owed) >= MAX_OWED:
                self._owed.popleft()
                self.dropped += 1
                if self.dropped == 1:
                    log.error("clients: more than %d decisions wait for the limits store: "
                              "the oldest are dropped", MAX_OWED)
            self._owed.append((rows, op, now, first_id))
        return Outcome(result, after)

    async def _write_back(self, now: float) -> bool:
        """Whether the store may be tried now: up or due for a retry, with nothing owed to it
        any more (what was owed is written first)."""
        if not self.up and now < self._retry_at:
            return False
        if not self._owed:
            return True
        if self._replay is None or self._replay.done():
            # a task of its own, so that a caller cancelled meanwhile does not cut an entry
            # in half (written, yet still owed: written again)
            self._replay = asyncio.ensure_future(self._write_owed(now))
        return await asyncio.shield(self._replay)

    async def _write_owed(self, now: float) -> bool:
        while self._owed:
            rows, op, at, first_id = self._owed[0]
            try:
                await self.store.transact_with(rows, _unchecked, op, at, first_id)
            except LimitsStoreDown as exc:
                self._lost(exc, now)
                return False
            self._owed.popleft()
            self._back()
        return True

    def _back(self) -> None:
        if not self.up:
            self.up = True
            log.warning("clients: the limits store (%s) answers again; what was decided "
                        "meanwhile is written back to it (%d decisions taken locally in "
                        "all)", self.mode, self.local_decisions)

    def _lost(self, exc: Exception, now: float) -> None:
        self.failures += 1
        self._retry_at = now + RETRY_S
        if self.up:
            self.up = False
            log.warning("clients: the limits store (%s) failed (%s): clients' limits are "
                        "decided on the rows this tracker last read, and written back when "
                        "it answers again", self.mode, exc)

    def _remember(self, rows: dict[str, list[dict[str, Any]]]) -> None:
        for row in rows.get(CLIENTS, ()):
            self._seen[(CLIENTS, str(row["name"]), int(row["key"]))] = row


def _unchecked(first_id: int) -> ClientGates:
    """Gates that count what was decided while the store was away, whatever its limits."""
    return ClientGates(first_id=first_id, enforce=False)
