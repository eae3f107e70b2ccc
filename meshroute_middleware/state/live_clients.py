"""`LiveClients`: the clients' LimitsStore of one process that shares its limits with nobody
(no state file, no Redis): one `ClientGates` held live in memory, each decision run on it
directly. A store shared by processes must rebuild a decision's gates from the rows it reads
(state/limits.py's `decide`); one process alone has nothing to read back, so a key costs no
snapshot round-trip here (issue 32, "a key costs little").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

from meshroute_middleware.core.clients_budget import CLIENTS, USAGE, ClientGates
from meshroute_middleware.core.providers.keys import KeyGates, RowName
from meshroute_middleware.state.limits import G, LimitsStoreDown, Outcome, ledger_of

T = TypeVar("T")
_NO_ROWS: dict[str, list[dict[str, Any]]] = {}  # a live decision reads no rows back


class LiveClients:
    """Clients' limits, budgets and ledger in this process's memory, decided in place."""

    mode = "local"
    blocking = True
    reads_rows = False  # a decision's rows need not be named

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.gates = ClientGates()

    def transact_now(self, rows: Sequence[RowName], op: Callable[[KeyGates], T], now: float,
                     first_id: int) -> Outcome[T]:
        raise LimitsStoreDown("LiveClients holds clients' gates only")

    async def transact(self, rows: Sequence[RowName], op: Callable[[KeyGates], T],
                       now: float, first_id: int) -> Outcome[T]:
        raise LimitsStoreDown("LiveClients holds clients' gates only")

    async def transact_with(self, rows: Sequence[RowName], make: Callable[[int], G],
                            op: Callable[[G], T], now: float, first_id: int) -> Outcome[T]:
        """`op` on the live gates (`make` is not called: they are the clients' gates, and
        one process's decisions need no rows read back)."""
        self.gates.number_from(first_id)
        return Outcome(op(cast(G, self.gates)), _NO_ROWS)

    async def scan(self, section: str) -> list[dict[str, Any]]:
        if section == USAGE:
            return self.gates.ledger()
        if section == CLIENTS:
            return self.gates.snapshot(self.clock())[CLIENTS]
        return []

    async def usage(self, client: str | None, first_day: int) -> list[dict[str, Any]]:
        return ledger_of(self.gates.ledger(), client, first_day)

    async def heartbeat(self, tracker: str, now: float) -> int:
        return 1
