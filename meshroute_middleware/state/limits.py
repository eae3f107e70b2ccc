"""Provider key gates shared by the processes of one host or of many: the `LimitsStore` seam.

The decision stays the core's (`KeyGates`, a pure function of its rows and `now`); a store only
loads the rows a decision reads, runs it on a fresh `KeyGates`, and writes back the rows it
changed, atomically (`transact`). Implementations: `MemoryLimits` (one process's memory: the
in-process twin, for tests), `SqliteLimits` (state/sqlite_limits.py: the state file the
workers of `--workers N` already share; `BEGIN IMMEDIATE`), `RedisLimits`
(state/redis_limits.py, `--limits-store redis://…`). `SharedGates` (state/shared_gates.py)
is the `KeyGates` a ProviderRouter is given to use one.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

import orjson

from meshroute_middleware.core.clients_budget import USAGE
from meshroute_middleware.core.errors import MeshRouteError
from meshroute_middleware.core.providers.keys import (
    SHARED_SECTIONS,
    KeyGates,
    RowName,
    Snapshot,
)

T = TypeVar("T")
G = TypeVar("G", bound="Gates")
TRACKERS_WINDOW_S = 60.0  # trackers that used the store within this share its limits
RETENTION_DAYS = 400  # the Redis ledger keeps a row this long after its UTC day (a year+)


class LimitsStoreError(MeshRouteError, ValueError):
    """The limits store cannot be used (at start: a one-line error, exit 2)."""


class LimitsStoreDown(LimitsStoreError):
    """The store failed a transaction; the caller decides locally for a while."""


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """What a decision returned, and the rows it read as they are after it."""

    result: T
    rows: Snapshot


class Gates(Protocol):
    """What decides on rows: the provider key gates (`KeyGates`) or the clients' gates
    (`core/clients_budget.ClientGates`)."""

    def restore(self, data: Snapshot) -> None: ...

    def snapshot(self, now: float, *, changed_only: bool = False,
                 shared: bool = False) -> Snapshot: ...


def key_gates(first_id: int) -> KeyGates:
    return KeyGates(first_id=first_id)


def decide(loaded: Snapshot, op: Callable[[G], T], now: float, first_id: int,
           make: Callable[[int], G]) -> tuple[T, Snapshot, Snapshot]:
    """Run `op` on gates (`make(first_id)`) holding `loaded`: its result, the rows it changed,
    all rows after."""
    gates = make(first_id)
    gates.restore(loaded)
    result = op(gates)
    changed = gates.snapshot(now, changed_only=True, shared=True)
    after: dict[RowName, dict[str, Any]] = {
        (s, str(r["name"]), int(r["key"])): r for s, rows in loaded.items() for r in rows}
    for section, rows in changed.items():
        for row in rows:
            after[(section, str(row["name"]), int(row["key"]))] = row
    return result, changed, rows_by_section(after)


def rows_by_section(rows: dict[RowName, dict[str, Any]]) -> Snapshot:
    out: Snapshot = {s: [] for s in SHARED_SECTIONS}
    for (section, _, _), row in rows.items():
        out.setdefault(section, []).append(row)
    return out


def ledger_of(rows: list[dict[str, Any]], client: str | None,
              first_day: int) -> list[dict[str, Any]]:
    """The ledger rows of `client` (None: all) from `first_day` on."""
    return [r for r in rows if (client is None or r["client"] == client)
            and int(r["day"]) >= first_day]


def encode(row: dict[str, Any]) -> str:
    """A row's data as stored: JSON without its name and key (those name the row), keys
    sorted, compact. orjson writes it (a minute's buckets: ~7x faster than the standard
    library, measured); a text holding `null` is written again by the standard library,
    which refuses NaN and infinities (orjson writes them as null) and takes integers past
    64 bits (orjson refuses them)."""
    data = dict(row)  # copied and trimmed in C: a row has a dozen fields, one per request
    data.pop("name", None)
    data.pop("key", None)
    try:
        text = orjson.dumps(data, option=orjson.OPT_SORT_KEYS)
    except TypeError:  # an integer past 64 bits
        text = b"null"
    if b"null" not in text:
        return text.decode()
    return json.dumps(data, separators=(",", ":"), sort_keys=True, allow_nan=False)


def decode(name: RowName, data: str | bytes) -> dict[str, Any]:
    fields = json.loads(data)
    if not isinstance(fields, dict):
        raise ValueError(f"limits row {name} is not an object")
    return {**fields, "name": name[1], "key": name[2]}


class LimitsStore(Protocol):
    """Where shared gates keep their rows. `blocking` stores are fast local I/O whose
    `transact_now` runs on the event loop; others only `transact` (awaited)."""

    mode: str  # "state-file" | "redis" (what GET /v1/routing/chain says per key)
    blocking: bool

    def transact_now(self, rows: Sequence[RowName], op: Callable[[KeyGates], T], now: float,
                     first_id: int) -> Outcome[T]: ...

    async def transact(self, rows: Sequence[RowName], op: Callable[[KeyGates], T],
                       now: float, first_id: int) -> Outcome[T]: ...

    async def transact_with(self, rows: Sequence[RowName], make: Callable[[int], G],
                            op: Callable[[G], T], now: float, first_id: int) -> Outcome[T]:
        """`transact` on other gates than the key gates (the clients')."""
        ...

    async def scan(self, section: str) -> list[dict[str, Any]]:
        """Every row of `section`."""
        ...

    async def usage(self, client: str | None, first_day: int) -> list[dict[str, Any]]:
        """The usage ledger's rows of `client` (None: all) from UTC day `first_day` on
        (GET /v1/usage)."""
        ...

    async def heartbeat(self, tracker: str, now: float) -> int:
        """Say `tracker` uses the store now; how many trackers did in the last minute."""
        ...


class MemoryLimits:
    """Rows in this process's memory: what several SharedGates of one process share (tests)."""

    mode = "local"
    blocking = True

    def __init__(self) -> None:
        self.rows: dict[RowName, dict[str, Any]] = {}
        self.down = False  # a test takes the store away
        self.seen: dict[str, float] = {}  # tracker -> when it last said it uses the store

    def transact_now(self, rows: Sequence[RowName], op: Callable[[KeyGates], T], now: float,
                     first_id: int) -> Outcome[T]:
        return self._transact(rows, key_gates, op, now, first_id)

    async def transact_with(self, rows: Sequence[RowName], make: Callable[[int], G],
                            op: Callable[[G], T], now: float, first_id: int) -> Outcome[T]:
        return self._transact(rows, make, op, now, first_id)

    async def scan(self, section: str) -> list[dict[str, Any]]:
        if self.down:
            raise LimitsStoreDown("memory store taken away")
        return [dict(row) for name, row in self.rows.items() if name[0] == section]

    async def usage(self, client: str | None, first_day: int) -> list[dict[str, Any]]:
        return ledger_of(await self.scan(USAGE), client, first_day)

    def _transact(self, rows: Sequence[RowName], make: Callable[[int], G],
                  op: Callable[[G], T], now: float, first_id: int) -> Outcome[T]:
        if self.down:
            raise LimitsStoreDown("memory store taken away")
        loaded = rows_by_section({r: self.rows[r] for r in rows if r in self.rows})
        result, changed, after = decide(loaded, op, now, first_id, make)
        for section, items in changed.items():
            for row in items:
                self.rows[(section, str(row["name"]), int(row["key"]))] = row
        return Outcome(result, after)

    async def transact(self, rows: Sequence[RowName], op: Callable[[KeyGates], T],
                       now: float, first_id: int) -> Outcome[T]:
        return self.transact_now(rows, op, now, first_id)

    async def heartbeat(self, tracker: str, now: float) -> int:
        if self.down:
            raise LimitsStoreDown("memory store taken away")
        self.seen[tracker] = now
        return sum(at > now - TRACKERS_WINDOW_S for at in self.seen.values())
