"""HTTP node registrations shared by the `--workers` of one gateway (issue 33).

A node agent's `POST /v1/nodes` and its `DELETE /v1/nodes/ID` at exit reach one worker (the
kernel picks it per connection). Each worker that accepts one appends it to a log table of
the state file the workers already share; every worker reads the rows of the others every
`POLL_S` and applies them as the same HTTP write: a registration joins (or refreshes) the
node there too, a removal removes it. So a DELETE reaches the whole gateway within ~POLL_S.
Rows older than `KEEP_S` are pruned: a node agent refreshes every 10 s, so a worker never
needs an older one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from meshroute_middleware.core import InvalidNodeError
from meshroute_middleware.mesh import Mesh, MeshFullError

log = logging.getLogger("meshroute.serve")
POLL_S = 0.5  # a removal reaches every worker within about this (issue 33 asks 2 s)
KEEP_S = 600.0  # rows kept this long (a node agent refreshes every 10 s)
NODES, NODE_PREFIX = "/v1/nodes", "/v1/nodes/"
_SCHEMA = """CREATE TABLE IF NOT EXISTS node_writes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, origin TEXT NOT NULL, node_id TEXT NOT NULL,
    record TEXT, at REAL NOT NULL)"""


@dataclass(frozen=True, slots=True)
class NodeWrite:
    """One accepted HTTP write: `record` (the POSTed JSON) joins; None removes `node_id`."""

    seq: int
    node_id: str
    record: str | None


class NodeLog:
    """The node_writes table of the workers' state file, for the worker `origin`."""

    def __init__(self, path: str, origin: str, clock: Callable[[], float] = time.time) -> None:
        self.path, self.origin, self.clock = path, origin, clock
        self.seen = 0  # the last row this worker has read

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        """One transaction on a connection closed after it (the poll runs every POLL_S)."""
        db = sqlite3.connect(self.path, timeout=10)
        try:
            with db:
                yield db
        finally:
            db.close()

    def open(self) -> NodeLog:
        """Start reading after the rows written so far (a new worker registers afresh)."""
        with self._connect() as db:
            db.execute(_SCHEMA)
            self.seen = int(db.execute("SELECT COALESCE(MAX(seq), 0) FROM node_writes")
                            .fetchone()[0])
        return self

    def append(self, node_id: str, record: str | None) -> None:
        now = self.clock()
        with self._connect() as db:
            db.execute("INSERT INTO node_writes (origin, node_id, record, at) VALUES "
                       "(?, ?, ?, ?)", (self.origin, node_id, record, now))
            db.execute("DELETE FROM node_writes WHERE at < ?", (now - KEEP_S,))

    def others(self) -> list[NodeWrite]:
        """The other workers' rows since the last call, in order."""
        with self._connect() as db:
            rows = db.execute("SELECT seq, origin, node_id, record FROM node_writes "
                              "WHERE seq > ? ORDER BY seq", (self.seen,)).fetchall()
        if rows:
            self.seen = int(rows[-1][0])
        return [NodeWrite(int(seq), str(node), rec) for seq, origin, node, rec in rows
                if origin != self.origin]


def apply(mesh: Mesh, write: NodeWrite) -> None:
    """A sibling's accepted write, made here as the same trusted HTTP write."""
    if write.record is None:
        mesh.remove(write.node_id)
        return
    try:
        mesh.upsert_raw(json.loads(write.record), "http")
    except (ValueError, InvalidNodeError, MeshFullError) as exc:  # as the sibling could not
        log.warning("shared node write of %s not applied: %s", write.node_id, exc)


async def follow(mesh: Mesh, node_log: NodeLog, poll_s: float = POLL_S) -> None:
    """Apply the siblings' node writes as they come (a background service)."""
    while True:
        for write in await asyncio.to_thread(node_log.others):
            apply(mesh, write)
        await asyncio.sleep(poll_s)


class ShareNodeWrites:
    """ASGI wrapper: a node write this worker accepted (2xx) goes into the log, after its
    answer was sent (the agent never waits for the file)."""

    def __init__(self, app: ASGIApp, node_log: NodeLog) -> None:
        self.app, self.node_log = app, node_log

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, method = scope.get("path", ""), scope.get("method")
        if scope["type"] != "http" or not (
                (method == "POST" and path == NODES)
                or (method == "DELETE" and path.startswith(NODE_PREFIX))):
            await self.app(scope, receive, send)
            return
        body: list[bytes] = []
        status = 0

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                body.append(message.get("body", b""))
            return message

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        await self.app(scope, receiving, sending)
        if 200 <= status < 300:
            node_id, record = _write_of(method == "POST", path, b"".join(body))
            if node_id:
                await asyncio.to_thread(self.node_log.append, node_id, record)


def _write_of(post: bool, path: str, body: bytes) -> tuple[str, str | None]:
    if not post:
        return path[len(NODE_PREFIX):], None  # the scope's path is decoded already
    try:
        data: Any = json.loads(body)
    except ValueError:
        return "", None
    node_id = data.get("node_id") if isinstance(data, dict) else None
    return (node_id, body.decode()) if isinstance(node_id, str) else ("", None)
