"""The shared gates' rows in the state file (`--workers N`): the `route_state` rows that
`StateStore` persists for one process, plus sections it does not read (`revoked`, `cursor`,
`tracker`), one `BEGIN IMMEDIATE` transaction per decision. Each worker opens its own
connection; it never checkpoints the WAL itself (the StateKeeper's writes do, off the loop).

The clients' gates (`transact_with`) are kept live in this process, as state/live_clients.py
keeps them, and stay exact across the processes sharing the file: each transaction still
reads its rows, and a row whose stored text is not the one this process last wrote or read
(another worker changed it, or it is gone) is loaded again; the rest are decided on as held,
with no decoding or rebuilding (issue 32, "a key costs little"). A transaction that fails
drops what is held: the next one loads everything again.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from meshroute_middleware.core.clients_budget import CLIENTS, USAGE, ClientGates
from meshroute_middleware.core.providers.keys import KeyGates, RowName, Snapshot
from meshroute_middleware.state.limits import (
    TRACKERS_WINDOW_S,
    G,
    LimitsStoreDown,
    LimitsStoreError,
    Outcome,
    decide,
    decode,
    encode,
    key_gates,
    ledger_of,
    rows_by_section,
)

T = TypeVar("T")
MAX_LIVE_LEDGER = 4096  # ledger rows held live; past it they are dropped (read again if used)
SQLITE_BUSY_S = 2.0  # a state file locked longer than this counts as failed, for RETRY_S


class SqliteLimits:
    """The rows in the state file's `route_state` table (the ones `StateStore` persists, plus
    revocations, round-robin positions and reservations), one `BEGIN IMMEDIATE` transaction
    per decision; every worker of the host opens its own connection."""

    mode = "state-file"
    blocking = True

    def __init__(self, path: str, busy_s: float = SQLITE_BUSY_S) -> None:
        self.path, self.busy_s = path, busy_s
        self._db: sqlite3.Connection | None = None
        self._select: dict[int, str] = {}
        self._live: dict[Callable[[int], Any], _Live] = {}  # per kind of gates (`make`)

    def open(self) -> SqliteLimits:
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                 timeout=self.busy_s)
            db.execute("PRAGMA synchronous=NORMAL")  # WAL (set by StateStore): no fsync/commit
            # checkpoints (with their fsync) are left to the StateKeeper's writes, off the
            # event loop: this connection only appends to the WAL
            db.execute("PRAGMA wal_autocheckpoint=0")
            db.execute("SELECT 1 FROM route_state LIMIT 1").fetchall()
        except sqlite3.Error as exc:
            raise LimitsStoreError(f"cannot share limits in state file {self.path}: "
                                   f"{exc}") from exc
        self._db = db
        return self

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def transact_now(self, rows: Sequence[RowName], op: Callable[[KeyGates], T], now: float,
                     first_id: int) -> Outcome[T]:
        return self._transact(rows, key_gates, op, now, first_id)

    async def transact_with(self, rows: Sequence[RowName], make: Callable[[int], G],
                            op: Callable[[G], T], now: float, first_id: int) -> Outcome[T]:
        """`op` on gates of `make`'s kind held live, their rows checked against the file."""
        db = self._db
        if db is None:
            raise LimitsStoreDown(f"state file {self.path} is not open")
        live = self._live.get(make)
        if live is None:
            gates = make(first_id)
            if not isinstance(gates, ClientGates):  # only the clients' gates are held live
                return self._transact(rows, make, op, now, first_id)
            live = self._live[make] = _Live(gates)
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                result, writes = live.decide(rows, self._texts(db, rows), op, now,
                                             first_id)
                db.executemany(_UPSERT, [(*name, text, now) for name, text in writes])
            except BaseException:
                del self._live[make]
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            self._live.pop(make, None)
            raise LimitsStoreDown(f"state file {self.path}: {exc}") from exc
        return Outcome(result, live.rows(rows, writes))

    async def scan(self, section: str) -> list[dict[str, Any]]:
        db = self._db
        if db is None:
            raise LimitsStoreDown(f"state file {self.path} is not open")
        try:
            found = db.execute("SELECT name, key_pos, data FROM route_state WHERE section = ?",
                               (section,)).fetchall()
        except sqlite3.Error as exc:
            raise LimitsStoreDown(f"state file {self.path}: {exc}") from exc
        return [decode((section, name, key), data) for name, key, data in found]

    async def usage(self, client: str | None, first_day: int) -> list[dict[str, Any]]:
        return ledger_of(await self.scan(USAGE), client, first_day)

    def _transact(self, rows: Sequence[RowName], make: Callable[[int], G],
                  op: Callable[[G], T], now: float, first_id: int) -> Outcome[T]:
        db = self._db
        if db is None:
            raise LimitsStoreDown(f"state file {self.path} is not open")
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                result, changed, after = decide(self._load(db, rows), op, now, first_id,
                                                make)
                db.executemany(_UPSERT, [(section, str(r["name"]), int(r["key"]), encode(r),
                                          now) for section, items in changed.items()
                                         for r in items])
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise LimitsStoreDown(f"state file {self.path}: {exc}") from exc
        return Outcome(result, after)

    async def transact(self, rows: Sequence[RowName], op: Callable[[KeyGates], T],
                       now: float, first_id: int) -> Outcome[T]:
        return self.transact_now(rows, op, now, first_id)

    async def heartbeat(self, tracker: str, now: float) -> int:
        """A `tracker` row per process (a section StateStore.load does not read)."""
        db = self._db
        if db is None:
            raise LimitsStoreDown(f"state file {self.path} is not open")
        try:
            db.execute("INSERT INTO route_state (section, name, key_pos, data, updated_at) "
                       "VALUES ('tracker', ?, 0, '{}', ?) ON CONFLICT (section, name, "
                       "key_pos) DO UPDATE SET updated_at = excluded.updated_at",
                       (tracker, now))
            row = db.execute("SELECT COUNT(*) FROM route_state WHERE section = 'tracker' "
                             "AND updated_at > ?", (now - TRACKERS_WINDOW_S,)).fetchone()
        except sqlite3.Error as exc:
            raise LimitsStoreDown(f"state file {self.path}: {exc}") from exc
        return int(row[0])

    def _load(self, db: sqlite3.Connection, rows: Sequence[RowName]) -> Snapshot:
        return rows_by_section({name: decode(name, data)
                                for name, data in self._texts(db, rows).items()})

    def _texts(self, db: sqlite3.Connection, rows: Sequence[RowName]) -> dict[RowName, str]:
        """The stored data of those of `rows` the file holds."""
        wanted = set(rows)
        pairs = sorted({(s, n) for s, n, _ in rows})
        if not pairs:
            return {}
        sql = self._select.get(len(pairs))
        if sql is None:
            sql = self._select[len(pairs)] = (
                "SELECT section, name, key_pos, data FROM route_state WHERE "
                + " OR ".join(["(section = ? AND name = ?)"] * len(pairs)))
        out: dict[RowName, str] = {}
        for section, name, key, data in db.execute(sql, [x for p in pairs for x in p]):
            if (section, name, key) in wanted:
                out[(section, name, key)] = data
        return out

    @staticmethod
    def new_run(path: str) -> None:
        """Before the workers of a run start: revocations are not kept across restarts (a
        restart is how a replaced key arrives at its position), nor reservations in flight."""
        with sqlite3.connect(path, isolation_level=None, timeout=5.0) as db:
            db.execute("DELETE FROM route_state WHERE section IN ('revoked', 'cursor', "
                       "'tracker')")
            db.execute("UPDATE route_state SET data = json_remove(data, '$.inflight') "
                       "WHERE section IN ('windows', 'clients')")
        db.close()


_UPSERT = ("INSERT INTO route_state (section, name, key_pos, data, updated_at) VALUES "
           "(?, ?, ?, ?, ?) ON CONFLICT (section, name, key_pos) DO UPDATE SET "
           "data = excluded.data, updated_at = excluded.updated_at")


class _Live:
    """Gates held across transactions, and each row's data as this process last wrote or
    read it (what tells a row another process changed)."""

    def __init__(self, gates: ClientGates) -> None:
        self.gates = gates
        self.known: dict[RowName, tuple[str, dict[str, Any]]] = {}

    def decide(self, rows: Sequence[RowName], stored: dict[RowName, str],
               op: Callable[[Any], T], now: float,
               first_id: int) -> tuple[T, list[tuple[RowName, str]]]:
        """`op`'s result on the gates, `rows` brought up to date from `stored` (their data
        in the file) first, and the rows it changed, encoded."""
        gates, known = self.gates, self.known
        stale: dict[RowName, dict[str, Any]] = {}
        for name in rows:
            text = stored.get(name)
            held = known.get(name)
            if text is None:  # not in the file (never written, or removed): not held
                if held is not None or name[0] == CLIENTS:
                    known.pop(name, None)
                    gates.forget(name)
            elif held is None or held[0] != text:
                row = decode(name, text)
                stale[name] = row
                known[name] = (text, row)
        if stale:
            gates.restore(rows_by_section(stale))
        gates.number_from(first_id)
        result = op(gates)
        writes = []
        for section, items in gates.snapshot(now, changed_only=True, shared=True).items():
            for row in items:
                name = (section, str(row["name"]), int(row["key"]))
                text = encode(row)
                known[name] = (text, row)
                writes.append((name, text))
        if len(known) > MAX_LIVE_LEDGER:  # the ledger's old days: the file keeps them
            gates.forget_ledger()
            self.known = {n: v for n, v in known.items() if n[0] != USAGE}
        return result, writes

    def rows(self, rows: Sequence[RowName], writes: list[tuple[RowName, str]]) -> Snapshot:
        """`rows` and those written, as they are after the decision."""
        names = dict.fromkeys([*rows, *(name for name, _ in writes)])
        return rows_by_section({n: self.known[n][1] for n in names if n in self.known})


MOVED_SECTIONS = ("windows", "keys", "clients", "usage")  # what `limits migrate` moves


def rows_to_move(path: str) -> list[tuple[RowName, dict[str, Any]]]:
    """The rows of a state file that another store takes over (`meshroute limits migrate`):
    provider key windows and months, clients' windows and budgets, and the usage ledger;
    reservations in flight left out (a new run has none), as revocations and positions
    are. LimitsStoreError naming the file if it cannot be read."""
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5.0) as db:
            found = db.execute(
                "SELECT section, name, key_pos, data FROM route_state WHERE section IN "
                f"({', '.join('?' * len(MOVED_SECTIONS))}) ORDER BY section, name, key_pos",
                MOVED_SECTIONS).fetchall()
        db.close()
    except sqlite3.Error as exc:
        raise LimitsStoreError(f"cannot read state file {path}: {exc}") from exc
    out = []
    for section, name, key, data in found:
        row = decode((section, name, key), data)
        if section in ("windows", "clients"):
            row["inflight"] = []
        out.append(((str(section), str(name), int(key)), row))
    return out
