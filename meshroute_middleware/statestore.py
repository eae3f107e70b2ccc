"""SQLite persistence of provider-route state, so a restart resets no quota and no cooldown.

Stores `ProviderRouter.snapshot()` rows: rate-limit windows and daily counters per provider key
(`windows`), cooldowns, the 429 ladder and monthly counters per route key (`keys`), and learned
statistics with the rate-limit penalty per route (`stats`). A row is keyed by section, name
(provider or route) and 1-based key position (0 for a route's statistics): a key's value is in
no column. stdlib sqlite3 in WAL mode, each save one transaction; `:memory:` keeps nothing.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from .core.errors import MeshRouteError

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
"""


class StateStoreError(MeshRouteError):
    """The state file cannot be opened, read or written; the message names the file."""


class StateStore:
    """One SQLite file of provider-route state. Cheap to build; `open()` touches the disk."""

    def __init__(self, path: str | Path = MEMORY) -> None:
        self.path = str(path)
        self._db: sqlite3.Connection | None = None

    def open(self) -> StateStore:
        """Connect, switch to WAL, create or check the schema; raises StateStoreError."""
        try:
            db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                                 timeout=5.0)
        except sqlite3.Error as exc:
            raise StateStoreError(f"cannot open state file {self.path}: {exc}") from exc
        try:
            if self.path != MEMORY:
                mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                if str(mode).lower() != "wal":
                    raise sqlite3.OperationalError(f"journal mode {mode}, not wal")
                db.execute("PRAGMA synchronous=NORMAL")  # WAL: durable at checkpoint, fast
            db.executescript(_SCHEMA)
            self._check_version(db)
        except (sqlite3.Error, StateStoreError) as exc:
            db.close()
            if isinstance(exc, StateStoreError):
                raise
            raise StateStoreError(f"cannot open state file {self.path}: {exc}") from exc
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

    def save(self, snapshot: Mapping[str, Sequence[Mapping[str, Any]]], now: float) -> int:
        """Write (upsert) every row of a snapshot in one transaction; how many rows."""
        rows = list(_rows(snapshot, now))
        db = self._conn()
        try:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "INSERT INTO route_state (section, name, key_pos, data, updated_at) "
                    "VALUES (?, ?, ?, ?, ?) ON CONFLICT (section, name, key_pos) DO UPDATE "
                    "SET data = excluded.data, updated_at = excluded.updated_at", rows)
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StateStoreError(f"cannot write state file {self.path}: {exc}") from exc
        return len(rows)

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            raise StateStoreError(f"state file {self.path} is not open")
        return self._db

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
