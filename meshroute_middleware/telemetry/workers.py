"""`meshroute serve --workers N` seen as one gateway: `/metrics` and `/v1/routing`'s request
counts are every worker's (worker_files.py), and every event stream carries every worker's
events (relay.py).

The parent makes the run's directory (`WorkersDir.create`: private, in the temporary
directory) before it starts the workers and removes it when they have ended; each worker
joins it (`join_workers`) after its gateway is built and before it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from meshroute_middleware.core.objectives import OBJECTIVES
from meshroute_middleware.telemetry.metrics import Telemetry
from meshroute_middleware.telemetry.relay import Relay, WorkerEventBus
from meshroute_middleware.telemetry.worker_files import (
    SYNC_S,
    WorkerFiles,
    without_label,
    worker_ended,
)

log = logging.getLogger("meshroute.serve")
COUNTS_MEMO_S = 0.05  # /v1/routing reads three counts at once: one merge serves them all
CLIENT_LABEL = "client"
SHM = "/dev/shm"
PREFIX = "meshroute-workers-"


@dataclass(frozen=True, slots=True)
class GatewayCounts:
    """/v1/routing's request counts, summed over the workers."""

    requests: dict[str, int]
    objectives: dict[str, int]
    in_flight: dict[str, int]  # attempts open on each mesh route, by signature
    embeddings_in_flight: dict[str, int]  # embeddings attempts, likewise


class _Families:
    """Families already computed, as generate_latest reads a registry."""

    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


class WorkerMetrics:
    """One worker's view of the gateway's metrics: its own written to its files, every
    worker's merged from theirs."""

    def __init__(self, files: WorkerFiles,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.files, self.clock = files, clock
        self._counts: tuple[float, GatewayCounts] | None = None

    def sync(self, telemetry: Telemetry) -> set[str]:
        """Write this worker's families to its files; the names of the per-client ones."""
        own, clients = telemetry.own_families()
        self.files.write([*own, *clients], time.time())
        return {m.name for m in clients}

    def render(self, telemetry: Telemetry, per_client: bool) -> bytes:
        """The exposition of the whole gateway: every worker's own families merged, and
        the shared ones as this worker knows them."""
        clients = self.sync(telemetry)
        merged = self.files.merged()
        if not per_client:
            merged = [without_label(m, CLIENT_LABEL) if m.name in clients else m
                      for m in merged]
        return generate_latest(_Families([*telemetry.shared_families(), *merged]))

    def render_cached(self, telemetry: Telemetry, now: float, max_age_s: float,
                      per_client: bool) -> bytes:
        """The last exposition any worker computed while it is younger than `max_age_s`,
        else a new one, so that the scrapes of a scraper never go back in time whichever
        worker answers each."""
        return self.shared("metrics-clients.prom" if per_client else "metrics.prom", now,
                           max_age_s, "-", lambda: self.render(telemetry, per_client))

    def shared(self, name: str, now: float, max_age_s: float, tag: str,
               compute: Callable[[], bytes]) -> bytes:
        """The body any worker last computed as `name`, while it is younger than `max_age_s`
        and was computed with the same `tag` (a word: what the body depends on beyond its
        age); else `compute()`'s, kept for the others. One worker computes it at a time,
        under a lock per name; while another one is at it, the last body of the same tag is
        answered rather than waiting for the lock (an event loop blocked on it would stall
        every request of the worker): never a body older than one already answered, so
        counts never go back. The file is replaced whole: no reader sees half of one."""
        cache = self.files.directory / name
        last = _read(cache)
        if last is not None and last[1] == tag and 0 <= now - last[0] < max_age_s:
            return last[2]
        with _locked(self.files.directory / f".{name}.lock",
                     wait=last is None or last[1] != tag) as held:
            if not held and last is not None:
                return last[2]
            last = _read(cache)  # another worker's, written while this one waited
            if last is not None and last[1] == tag and 0 <= now - last[0] < max_age_s:
                return last[2]
            body = compute()
            staging = cache.with_name(f".{cache.name}.{os.getpid()}.tmp")
            staging.write_bytes(f"{now!r} {tag}\n".encode() + body)
            os.replace(staging, cache)
            return body

    def counts(self, telemetry: Telemetry) -> GatewayCounts:
        """The gateway's request counts and attempts in flight (/v1/routing), merged from
        every worker's files (this worker's written first; a sibling's are SYNC_S old at
        most)."""
        now = self.clock()
        if self._counts is not None and 0 <= now - self._counts[0] < COUNTS_MEMO_S:
            return self._counts[1]
        self.sync(telemetry)
        merged = {m.name: m for m in self.files.merged()}
        counts = GatewayCounts(_by_label(merged.get("meshroute_requests"), "result",
                                         ("answered", "failed")),
                               _by_label(merged.get("meshroute_objective_requests"),
                                         "objective", OBJECTIVES),
                               _by_label(merged.get("meshroute_route_in_flight"),
                                         "signature", ()),
                               _by_label(merged.get("meshroute_embeddings_route_in_flight"),
                                         "signature", ()))
        self._counts = (now, counts)
        return counts

    async def run(self, telemetry: Telemetry) -> None:
        """Write this worker's files every SYNC_S, and once more when it stops."""
        try:
            while True:
                await asyncio.sleep(SYNC_S)
                try:
                    self.sync(telemetry)
                except OSError as exc:  # a full disk: the next round tries again
                    log.warning("worker metrics: %s", exc)
        finally:
            with contextlib.suppress(OSError):
                self.sync(telemetry)  # its last counts stay in the gateway's sums
                self.files.remove_live()


def _by_label(metric: Metric | None, label: str, keys: tuple[str, ...]) -> dict[str, int]:
    out = dict.fromkeys(keys, 0)
    for sample in metric.samples if metric is not None else ():
        name = sample.labels.get(label)
        if name is not None:
            out[name] = out.get(name, 0) + int(sample.value)
    return out


@contextlib.contextmanager
def _locked(path: Path, wait: bool = True) -> Iterator[bool]:
    """The lock file `path` held while the block runs (True); without `wait`, False at once
    when another process holds it."""
    with open(path, "a+b") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX if wait else fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _read(cache: Path) -> tuple[float, str, bytes] | None:
    """A shared body's file: (when, tag, body); None when there is none yet."""
    try:
        head, _, body = cache.read_bytes().partition(b"\n")
        stamp, _, tag = head.decode().partition(" ")
        return float(stamp), tag, body
    except (FileNotFoundError, ValueError):
        return None


@dataclass(frozen=True, slots=True)
class WorkersDir:
    """The run's directory: every worker's metric files and event sockets."""

    path: Path
    count: int

    @classmethod
    def create(cls, count: int) -> WorkersDir:
        """A new private directory (0700) for a run of `count` workers: in /dev/shm where
        there is one (memory: a file rewrite there took 48 µs, 1.5 ms on this machine's
        ext4 /tmp: docs/benchmarks/workers.md), else the temporary directory."""
        shm = SHM if os.access(SHM, os.W_OK | os.X_OK) else None
        path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=shm))
        _sweep(path.parent)
        (path / "parent").write_text(str(os.getpid()))
        return cls(path, count)

    def ended(self, pid: int) -> None:
        """Worker `pid` ended: its live gauges leave the merge, its counters stay."""
        with contextlib.suppress(OSError):
            worker_ended(self.path, pid)

    def remove(self) -> None:
        """Every worker has ended: the directory goes."""
        shutil.rmtree(self.path, ignore_errors=True)


def _sweep(base: Path) -> None:
    """Remove the directories of runs whose parent is gone (killed with SIGKILL, it could
    not remove its own): this user's, whose `parent` process no longer exists."""
    for old in base.glob(PREFIX + "*"):
        try:
            if old.stat().st_uid != os.getuid():
                continue
            os.kill(int((old / "parent").read_text()), 0)
        except ProcessLookupError:
            shutil.rmtree(old, ignore_errors=True)
        except (OSError, ValueError):  # another user's process, or a run still starting
            continue


class _Lifespan:
    """The gateway's app, with the worker's relay and metric files running while it
    serves (started and stopped with the ASGI lifespan)."""

    def __init__(self, app: ASGIApp, start: Callable[[], None],
                 stop: Callable[[], Any]) -> None:
        self.app, self.start, self.stop = app, start, stop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "lifespan":
            await self.app(scope, receive, send)
            return

        async def watched() -> Message:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self.start()
            elif message["type"] == "lifespan.shutdown":
                await self.stop()
            return message

        await self.app(scope, watched, send)


def join_workers(telemetry: Telemetry, app: ASGIApp, workers: WorkersDir,
                 index: int) -> ASGIApp:
    """Make this process worker `index` of `workers`: its telemetry shows the whole
    gateway; the returned app (serve it in place of `app`) runs the relay and the files."""
    metrics = WorkerMetrics(WorkerFiles(workers.path, os.getpid()))
    telemetry.workers = metrics
    if telemetry.requests is not None:
        telemetry.requests.gateway = lambda: metrics.counts(telemetry).requests
    bus = WorkerEventBus.replacing(telemetry.events, index, workers.count)
    telemetry.events = bus
    relay = Relay(bus, workers.path, index, workers.count)
    telemetry.add_collector(relay.metric_families)
    tasks: list[asyncio.Task[None]] = []

    def start() -> None:
        for name, work in (("worker files", metrics.run(telemetry)), ("event relay", relay.run())):
            task = asyncio.create_task(work, name=name)
            task.add_done_callback(_crashed)  # said when it happens, not at shutdown
            tasks.append(task)

    async def stop() -> None:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # a crash was logged already

    return _Lifespan(app, start, stop)


def _crashed(task: asyncio.Task[None]) -> None:
    """A worker's background task that stopped by itself: logged at once (its siblings no
    longer see this worker's events, or its files no longer follow)."""
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("meshroute: this worker's %s stopped: %r", task.get_name(), exc,
                  exc_info=exc)
