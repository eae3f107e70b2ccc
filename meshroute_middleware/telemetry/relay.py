"""Every worker's events on every worker's event stream (`meshroute serve --workers N`).

Each worker listens on a Unix socket in the run's private directory (`events-I.sock`) and
keeps a connection to each sibling's. What it publishes goes, every FLUSH_S (20 ms), as one
line of JSON (a list of events) to every sibling, which adds them to its own bus: its
history and its subscribers then hold every worker's events. Each event names its `worker`
(the index I of the `-wI` tracker id); ids stay unique across the workers (`id = n × count +
worker`, n a Lamport counter: above every id the worker has seen), so `?since=` and
`Last-Event-ID` work whichever worker a reconnecting client reaches.

The request path only appends the event to an outbox; rendering, encoding and writing run
once per FLUSH_S for every event published meanwhile. A sibling not connected yet (starting)
or behind gets the lines queued, up to MAX_QUEUED_BYTES; past that the newest miss it,
counted in `meshroute_worker_events_dropped_total`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from meshroute_middleware.telemetry.events import (
    HISTORY,
    MAX_SUBSCRIBERS,
    Entry,
    EventBus,
    Payload,
    as_is,
    materialize,
)

log = logging.getLogger("meshroute.serve")
MAX_QUEUED_BYTES = 4 * 1024 * 1024  # per sibling: ~10,000 events of ~400 bytes
MAX_LINE_BYTES = 16 * 1024 * 1024  # a longer line from a sibling ends its connection
RETRY_S = (0.05, 1.0)  # reconnecting to a sibling: first wait, longest wait
# Events go to the siblings at most this long after they were published, in one line: one
# write and one wake-up of each sibling per FLUSH_S under load, not one per event.
FLUSH_S = 0.02
MAX_OUTBOX = 10_000  # events waiting for the relay (it is not running: starting, or failed)


class WorkerEventBus(EventBus):
    """The event bus of worker `worker` of `count`: its events carry `worker`, ids are the
    gateway's, and its siblings' events come in through `ingest`."""

    def __init__(self, worker: int, count: int, history: int = HISTORY,
                 max_subscribers: int = MAX_SUBSCRIBERS) -> None:
        super().__init__(history, max_subscribers)
        self.worker, self.count = worker, count
        self._seq = 0
        self.outbox: list[Entry] = []  # published here, not yet sent to the siblings
        self.on_outbox: Callable[[], None] | None = None  # the relay's wake-up
        self.unsent = 0  # events past MAX_OUTBOX, never sent
        self._render = self._render_here  # one bound method, not one per event

    @classmethod
    def replacing(cls, bus: EventBus, worker: int, count: int) -> WorkerEventBus:
        """A bus for worker `worker` that keeps `bus`'s history (what was published while the
        gateway was built: a nodes file's nodes), renumbered."""
        new = cls(worker, count, bus.history_size, bus.max_subscribers)
        for _, kind, ts, render, content in bus.entries():
            new._add((new._next_id(), kind, ts, new._render, (render, content)))
        return new

    def _next_id(self) -> int:
        self._seq += 1
        return self._seq * self.count + self.worker

    def publish_lazy(self, kind: str, render: Callable[[Any], Payload], content: Any) -> None:
        entry: Entry = (self._next_id(), kind, time.time(), self._render, (render, content))
        self._add(entry)
        if len(self.outbox) >= MAX_OUTBOX:  # no relay running (yet): bounded all the same
            self.unsent += 1
            return
        self.outbox.append(entry)
        if len(self.outbox) == 1 and self.on_outbox is not None:
            self.on_outbox()

    def _render_here(self, pair: tuple[Callable[[Any], Payload], Any]) -> Payload:
        render, content = pair
        return {**render(content), "worker": self.worker}

    def take_outbox(self) -> list[Entry]:
        """The events published since the last call."""
        out, self.outbox = self.outbox, []
        return out

    def ingest(self, events: list[Any]) -> int:
        """Add a sibling's events (as its subscribers got them); how many were well-formed."""
        taken = 0
        for event in events:
            if not (isinstance(event, dict) and type(event.get("id")) is int
                    and isinstance(event.get("type"), str)
                    and isinstance(event.get("ts"), (int, float))):
                continue
            self._seq = max(self._seq, event["id"] // self.count)
            self._add((event["id"], event["type"], float(event["ts"]), as_is, event))
            taken += 1
        return taken


def encode(entries: list[Entry]) -> bytes:
    """One line: the events as a JSON list."""
    return json.dumps([materialize(e) for e in entries], separators=(",", ":")).encode() + b"\n"


class _Link:
    """The connection to one sibling, and the lines waiting for it."""

    __slots__ = ("queue", "queued", "transport")

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.queue: deque[bytes] = deque()
        self.queued = 0

    def send(self, line: bytes) -> bool:
        """Write or queue a line; False when the sibling is too far behind to take it."""
        transport = self.transport
        if transport is not None and not self.queue:
            if transport.get_write_buffer_size() > MAX_QUEUED_BYTES:
                return False
            transport.write(line)
            return True
        if self.queued + len(line) > MAX_QUEUED_BYTES:
            return False
        self.queue.append(line)
        self.queued += len(line)
        return True

    def connected(self, transport: asyncio.Transport) -> None:
        self.transport = transport
        while self.queue:
            transport.write(self.queue.popleft())
        self.queued = 0


class _Inbound(asyncio.Protocol):
    """A sibling's connection: lines of events into this worker's bus."""

    def __init__(self, bus: WorkerEventBus) -> None:
        self.bus = bus
        self.buffer = bytearray()
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.rfind(b"\n")
        if end < 0:
            if len(self.buffer) > MAX_LINE_BYTES and self.transport is not None:
                self.transport.close()
            return
        lines, self.buffer = bytes(self.buffer[:end]), self.buffer[end + 1:]
        for line in lines.split(b"\n"):
            try:
                events = json.loads(line)
            except ValueError:
                continue
            if isinstance(events, list):
                self.bus.ingest(events)


class _Outbound(asyncio.Protocol):
    """This worker's connection to a sibling: written to, never read; `lost` when it ends."""

    def __init__(self) -> None:
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.lost.done():
            self.lost.set_result(None)


class Relay:
    """Worker `index`'s events to its siblings, and theirs into its bus."""

    def __init__(self, bus: WorkerEventBus, directory: Path, index: int, count: int) -> None:
        self.bus, self.directory = bus, directory
        self.path = directory / f"events-{index}.sock"
        self.links = {j: _Link() for j in range(count) if j != index}
        self.dropped = 0  # events a sibling did not get (too far behind)
        self.lines = 0  # lines sent (one per batch)

    async def run(self) -> None:
        """Serve this worker's socket and keep a connection to each sibling until cancelled."""
        loop = asyncio.get_running_loop()
        try:
            self.path.unlink(missing_ok=True)  # a worker before this one, under this index
            server = await loop.create_unix_server(lambda: _Inbound(self.bus), str(self.path))
        except OSError as exc:  # e.g. a socket path past the system's 108 bytes
            log.warning("worker events: cannot listen on %s (%s): its event streams show "
                        "its own events only", self.path, exc)
            return
        scheduled = False

        def flush() -> None:
            nonlocal scheduled
            scheduled = False
            self.flush()

        def wake() -> None:
            nonlocal scheduled
            if not scheduled:
                scheduled = True
                loop.call_later(FLUSH_S, flush)

        self.bus.on_outbox = wake
        self.flush()  # what was published before the loop ran
        try:
            async with asyncio.TaskGroup() as tasks:
                for j, link in self.links.items():
                    tasks.create_task(self._keep(self.directory / f"events-{j}.sock", link))
        finally:
            self.bus.on_outbox = None
            server.close()
            for link in self.links.values():
                if link.transport is not None:
                    link.transport.close()

    def flush(self) -> None:
        """Send the events published since the last flush to every sibling."""
        entries = self.bus.take_outbox()
        if not entries or not self.links:
            return
        line = encode(entries)
        self.lines += 1
        for link in self.links.values():
            if not link.send(line):
                self.dropped += len(entries)

    async def _keep(self, path: Path, link: _Link) -> None:
        """Connect to a sibling's socket, again whenever the connection ends."""
        loop = asyncio.get_running_loop()
        wait = RETRY_S[0]
        while True:
            try:
                transport, protocol = await loop.create_unix_connection(_Outbound, str(path))
            except OSError:  # not listening yet (starting), or gone
                await asyncio.sleep(wait)
                wait = min(wait * 2, RETRY_S[1])
                continue
            wait = RETRY_S[0]
            link.connected(transport)
            try:
                await protocol.lost
            finally:
                link.transport = None
                with contextlib.suppress(Exception):
                    transport.close()

    def metric_families(self) -> Iterator[Metric]:
        """meshroute_worker_events_dropped_total."""
        dropped = CounterMetricFamily("meshroute_worker_events_dropped",
                                      "Events a sibling worker did not get (its connection "
                                      "was down or behind for too long)")
        dropped.add_metric([], self.dropped + self.bus.unsent)
        yield dropped
