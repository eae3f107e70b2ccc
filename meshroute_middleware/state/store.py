"""SQLite persistence of what a tracker learned, so a restart resets no statistic, quota or
cooldown.

Provider routes: `ProviderRouter.snapshot()` rows, rate-limit windows and daily counters per
provider key (`windows`), cooldowns, the 429 ladder and monthly counters per route key (`keys`),
and learned statistics with the rate-limit penalty per route (`stats`), keyed by section, name
(provider or route) and 1-based key position (0 for a route's statistics): a key's value is in
no column. With shared key gates (`--workers`, state/sqlite_limits.py) the same table also
holds revocations, round-robin positions and the workers' presence, in sections `load` does not
read. Mesh routes: one row per (model, signature, origin) statistics entry, the gossip
state (`route_stats`, restored with its timestamps so it comes back decayed for the time the
tracker was down; with each origin's saturation-curve summary, so the `thompson` policy gets
its curves back as priors), and per model the topology change time with the node set it belongs to
(`topology`). stdlib sqlite3 in WAL mode, each save one transaction, so a process killed
mid-write leaves the last committed save; `:memory:` keeps nothing. `StateKeeper`
(statekeeper.py) decides what to save when.
"""

from __future__ import annotations

import json
import math
import os
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from meshroute_middleware.core.errors import MeshRouteError
from meshroute_middleware.core.stats import Curve, StatEntry, parse_curve

SCHEMA_VERSION = 1
SECTIONS = ("windows", "keys", "stats")
MEMORY = ":memory:"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS route_state (
    section TEXT NOT NULL,      -- windows | keys | stats
    name TEXT NOT NULL,         -- provider (windows) or route (keys, stats)
    key_pos INTEGER NOT NULL,   -- 1-based position in the provider's keys; 0 for stats
    data TEXT NOT NULL,         -- JSON counters of the row
    updated_at REAL NOT NULL,
    PRIMARY KEY (section, name, key_pos)
);
CREATE TABLE IF NOT EXISTS route_stats (   -- mesh routes: one origin's entry of one route
    model TEXT NOT NULL,
    signature TEXT NOT NULL,
    origin TEXT NOT NULL,       -- the tracker that measured it (gossip's origin)
    value REAL NOT NULL, mass REAL NOT NULL, t REAL NOT NULL, ttfb_s REAL NOT NULL,
    ok REAL NOT NULL, fail REAL NOT NULL, count INTEGER NOT NULL, last_error TEXT NOT NULL,
    curve TEXT,                 -- JSON [[bin, mass, mean log tps], ...] (issue 14), or NULL
    PRIMARY KEY (model, signature, origin)
);
CREATE TABLE IF NOT EXISTS topology (      -- mesh models: when their node set last changed
    model TEXT PRIMARY KEY,
    changed_at REAL NOT NULL,
    nodes TEXT NOT NULL         -- JSON [[node_id, start, end, layers, url], ...], sorted
);
"""
# Tables added after version 1 are created when missing, and columns added (nullable) to
# files that predate them, so older files open; an older meshroute reads a newer file too (it
# names the columns it reads).
_ADDED_COLUMNS = (("route_stats", "curve", "TEXT"),)

EntryKey = tuple[str, str, str]  # (model, signature, origin), as gossip names an entry


class SavedTopology(NamedTuple):
    """A model's topology change time and the node set (`node_set`) it belongs to."""

    changed_at: float
    nodes: str


class RouteRows(NamedTuple):
    """Mesh route state to write: changed entries, changed models, and what to forget."""

    entries: Mapping[EntryKey, StatEntry]
    topology: Mapping[str, SavedTopology]
    tracker_id: str
    prune_before: float = -math.inf  # entries last updated before this are deleted


class SavedRoutes(NamedTuple):
    """Mesh route state as a previous run saved it."""

    entries: dict[tuple[str, str], dict[str, StatEntry]]
    topology: dict[str, SavedTopology]
    tracker_id: str | None


class StateStoreError(MeshRouteError):
    """The state file cannot be opened, read or written; the message names the file."""


class StateStore:
    """One SQLite file of a tracker's learned state. Cheap to build; `open()` touches the disk
    (and writes once, so that an unwritable file is an error at start)."""

    def __init__(self, path: str | Path = MEMORY) -> None:
        self.path = str(path)
        self._db: sqlite3.Connection | None = None

    def open(self) -> StateStore:
        """Connect, switch to WAL, create or check the schema; raises StateStoreError."""
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                 timeout=5.0)
        except sqlite3.Error as exc:
            raise StateStoreError(f"cannot open state file {self.path}: "
                                  f"{_reason(exc, self.path)}") from exc
        try:
            if self.path != MEMORY:
                mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise sqlite3.OperationalError(f"journal mode {mode}, not wal")
                # WAL + NORMAL: a killed process loses no commit, a power cut at most the last
                # ones, and neither ever tears the file
                db.execute("PRAGMA synchronous=NORMAL")
            db.executescript(_SCHEMA)
            _add_columns(db)
            self._check_version(db)
            self._check_writable(db)
        except (sqlite3.Error, StateStoreError) as exc:
            db.close()
            if isinstance(exc, StateStoreError):
                raise
            raise StateStoreError(f"cannot open state file {self.path}: "
                                  f"{_reason(exc, self.path)}") from exc
        self._db = db
        return self

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def __enter__(self) -> StateStore:
        return self if self._db is not None else self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def load(self) -> dict[str, list[dict[str, Any]]]:
        """Every stored row, in the shape `ProviderRouter.restore()` takes."""
        out: dict[str, list[dict[str, Any]]] = {s: [] for s in SECTIONS}
        try:
            rows = self._conn().execute(
                "SELECT section, name, key_pos, data FROM route_state "
                "ORDER BY section, name, key_pos").fetchall()
        except sqlite3.Error as exc:
            raise StateStoreError(f"cannot read state file {self.path}: {exc}") from exc
        for section, name, key_pos, data in rows:
            if section in out:
                try:
                    fields = json.loads(data)
                except ValueError as exc:
                    raise StateStoreError(f"state file {self.path}: row {section}/{name}/"
                                          f"{key_pos} is not JSON") from exc
                out[section].append({**fields, "name": name, "key": key_pos})
        return out

    def meta(self, name: str) -> str | None:
        """One value of the meta table (`tracker_id`, `schema_version`), or None."""
        try:
            row = self._conn().execute("SELECT value FROM meta WHERE name = ?",
                                       (name,)).fetchone()
        except sqlite3.Error as exc:
            raise StateStoreError(f"cannot read state file {self.path}: {exc}") from exc
        return None if row is None else str(row[0])

    def load_routes(self) -> SavedRoutes:
        """The mesh route state a previous run saved; StateStoreError naming a bad row."""
        db = self._conn()
        try:
            stats = db.execute(f"SELECT model, signature, origin, {_ENTRY_COLUMNS}, curve "
                               "FROM route_stats").fetchall()
            topo = db.execute("SELECT model, changed_at, nodes FROM topology").fetchall()
        except sqlite3.Error as exc:
            raise StateStoreError(f"cannot read state file {self.path}: {exc}") from exc
        entries: dict[tuple[str, str], dict[str, StatEntry]] = {}
        for model, signature, origin, *fields, curve in stats:
            entry = _entry(fields, curve)
            if entry is None or not all(isinstance(x, str) for x in (model, signature, origin)):
                raise StateStoreError(f"state file {self.path}: route_stats row {model}/"
                                      f"{signature}/{origin} is malformed")
            entries.setdefault((model, signature), {})[origin] = entry
        topology = {}
        for model, changed_at, nodes in topo:
            if not (isinstance(changed_at, float) and math.isfinite(changed_at)
                    and isinstance(nodes, str)):
                raise StateStoreError(f"state file {self.path}: topology row {model} is "
                                      "malformed")
            topology[str(model)] = SavedTopology(changed_at, nodes)
        return SavedRoutes(entries, topology, self.meta("tracker_id"))

    def save(self, snapshot: Mapping[str, Sequence[Mapping[str, Any]]], now: float,
             routes: RouteRows | None = None) -> int:
        """Write (upsert) every row of a provider snapshot and of `routes` in one transaction;
        how many rows. StateStoreError (naming the file and the reason) if it failed: then
        nothing of it was written."""
        rows = list(_rows(snapshot, now))
        db = self._conn()
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "INSERT INTO route_state (section, name, key_pos, data, updated_at) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (section, name, key_pos) DO UPDATE "
                    "SET data = excluded.data, updated_at = excluded.updated_at", rows)
                written = len(rows) + (_write_routes(db, routes) if routes else 0)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StateStoreError(f"cannot write state file {self.path}: "
                                  f"{_reason(exc, self.path)}") from exc
        return written

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StateStoreError(f"state file {self.path} is not open")
        return self._db

    def _check_writable(self, db: sqlite3.Connection) -> None:
        """A write at start, so a read-only file or directory or a full disk is an error now
        rather than a surprise at the first save."""
        if self.path == MEMORY:
            return
        if _diagnose(self.path) is not None:  # a write could still fit in pages SQLite holds
            raise sqlite3.OperationalError("not writable")
        db.execute("BEGIN IMMEDIATE")
        try:
            db.execute("INSERT INTO meta (name, value) VALUES ('opened', '1') "
                       "ON CONFLICT (name) DO UPDATE SET value = CAST(value AS INTEGER) + 1")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def _check_version(self, db: sqlite3.Connection) -> None:
        row = db.execute("SELECT value FROM meta WHERE name = 'schema_version'").fetchone()
        if row is None:
            db.execute("INSERT INTO meta (name, value) VALUES ('schema_version', ?)",
                       (str(SCHEMA_VERSION),))
        elif row[0] != str(SCHEMA_VERSION):
            raise StateStoreError(f"state file {self.path} has schema version {row[0]}; this "
                                  f"meshroute reads version {SCHEMA_VERSION}")


def _rows(snapshot: Mapping[str, Sequence[Mapping[str, Any]]],
          now: float) -> list[tuple[str, str, int, str, float]]:
    rows = []
    for section, items in snapshot.items():
        if section not in SECTIONS:
            raise ValueError(f"unknown state section {section!r}")
        for item in items:
            fields = {k: v for k, v in item.items() if k not in ("name", "key")}
            rows.append((section, str(item["name"]), int(item["key"]),
                         json.dumps(fields, allow_nan=False, sort_keys=True), now))
    return rows


_ENTRY_FIELDS = ("value", "mass", "t", "ttfb_s", "ok", "fail", "count", "last_error")
_ENTRY_COLUMNS = ", ".join(_ENTRY_FIELDS)


def _add_columns(db: sqlite3.Connection) -> None:
    for table, column, kind in _ADDED_COLUMNS:
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        if column not in have:
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")


def _curve_text(curve: Curve | None) -> str | None:
    return None if not curve else json.dumps([list(b) for b in curve], allow_nan=False)


def _entry(fields: Sequence[Any], curve_text: Any = None) -> StatEntry | None:
    """A StatEntry from a row's columns, or None when a column is out of its range."""
    curve: Curve | None = None
    if curve_text is not None:
        if not isinstance(curve_text, str):
            return None
        try:
            curve = parse_curve(json.loads(curve_text))
        except ValueError:  # json's errors are ValueErrors too
            return None
    *reals, count, last_error = fields
    if not all(isinstance(x, float | int) and math.isfinite(x) for x in reals):
        return None
    value, mass, t, ttfb_s, ok, fail = (float(x) for x in reals)
    if min(value, mass, ttfb_s, ok, fail) < 0 or not isinstance(count, int) or count < 0:
        return None
    if not isinstance(last_error, str):
        return None
    return StatEntry(value, mass, t, ttfb_s, ok, fail, count, last_error, curve)


def _write_routes(db: sqlite3.Connection, routes: RouteRows) -> int:
    db.executemany(
        f"INSERT INTO route_stats (model, signature, origin, {_ENTRY_COLUMNS}, curve) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (model, signature, origin) "
        "DO UPDATE SET " + ", ".join(f"{f} = excluded.{f}" for f in (*_ENTRY_FIELDS, "curve"))
        + " WHERE excluded.t >= route_stats.t",  # last writer wins per origin, as in gossip
        ((*key, *(getattr(e, f) for f in _ENTRY_FIELDS), _curve_text(e.curve))
         for key, e in routes.entries.items()))
    db.executemany(
        "INSERT INTO topology (model, changed_at, nodes) VALUES (?, ?, ?) ON CONFLICT (model) "
        "DO UPDATE SET changed_at = excluded.changed_at, nodes = excluded.nodes",
        ((m, s.changed_at, s.nodes) for m, s in routes.topology.items()))
    db.execute("INSERT INTO meta (name, value) VALUES ('tracker_id', ?) ON CONFLICT (name) "
               "DO UPDATE SET value = excluded.value", (routes.tracker_id,))
    if math.isfinite(routes.prune_before):
        db.execute("DELETE FROM route_stats WHERE t < ?", (routes.prune_before,))
    return len(routes.entries) + len(routes.topology)


def node_set(nodes: Iterable[tuple[str, int, int, int, str]]) -> str:
    """A model's node set as the topology table stores it: what a route depends on of each
    node (id, first and last layer, layer count, URL), sorted."""
    return json.dumps(sorted(list(n) for n in nodes), separators=(",", ":"))


def _reason(exc: sqlite3.Error, path: str) -> str:
    """SQLite's message, and what the operating system says is wrong with the file."""
    text = str(exc)
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int) and code & 0xFF == sqlite3.SQLITE_FULL:  # extended codes: low byte
        return f"{text}: no space left on device"
    why = _diagnose(path)
    return f"{text}: {why}" if why else text


def _diagnose(path: str) -> str | None:
    """Why a file cannot be created or written, as far as the file system tells."""
    if path == MEMORY:
        return None
    file = Path(path)
    if file.is_dir():
        return "it is a directory"
    if not file.parent.is_dir():
        return f"directory {file.parent} does not exist"
    try:
        fs = os.statvfs(file.parent)
    except OSError:
        return None
    if fs.f_flag & os.ST_RDONLY:
        return "read-only file system"
    if not os.access(file.parent, os.W_OK) or (file.exists() and not os.access(file, os.W_OK)):
        return "read-only file or directory (no write permission)"
    if fs.f_bavail == 0:
        return "no space left on device"
    return None
