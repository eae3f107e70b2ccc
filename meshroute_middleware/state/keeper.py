"""What the state file keeps of a running tracker, and when.

At start `restore` takes back the mesh route statistics of every origin (timestamps as
recorded, so they come back decayed for the time the tracker was down), the provider routes'
windows, cooldowns and statistics, and each model's topology change time once its node set is
back as it was saved. While serving, `run` writes the rows changed since the last good write
every SAVE_EVERY_S in a worker thread (routing never waits for the disk), and once more at
shutdown. A write that fails (full disk, read-only file) is counted
(`meshroute_state_write_errors_total`), logged at most once per WARN_EVERY_S, and retried with
everything still unsaved at the next interval; routing goes on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anyio
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from meshroute_middleware.core import Router
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.core.topology import ModelTopology
from meshroute_middleware.state.store import (
    RouteRows,
    SavedTopology,
    StateStore,
    StateStoreError,
    node_set,
)

log = logging.getLogger("meshroute.state")
SAVE_EVERY_S = 0.25  # changed rows written this often, off the request path
WARN_EVERY_S = 60.0  # a failing state file is logged at most this often (every failure counted)
SETTLE_S = 120.0  # a model whose nodes are back as saved within this of the start keeps its
#                   saved topology change time (two default health intervals and then some)
PRUNE_FILE_EVERY_S = 60.0  # rows older than the statistics' prune horizon deleted this often


@dataclass(frozen=True, slots=True)
class Pending:
    """One write: the rows changed since the last good one."""

    now: float
    providers: dict[str, list[dict[str, Any]]]
    routes: RouteRows
    keys: set[tuple[str, str]]  # the routes whose entries it writes (again, if it fails)
    versions: dict[str, int]  # the topology version of each model it writes


def topology_of(model: ModelTopology) -> str:
    """The node set of a model as the state file stores it."""
    return node_set((n.node_id, n.start, n.end, n.layers, n.url) for n in model.nodes.values())


class StateKeeper:
    """Restores a tracker from its state file and keeps the file current while it serves."""

    def __init__(self, store: StateStore, router: Router,
                 providers: ProviderRouter | None = None) -> None:
        self.store, self.router, self.providers = store, router, providers
        self.writes = 0  # transactions committed
        self.write_errors = 0  # transactions that failed (each retried at the next interval)
        self.saved_at = -math.inf  # when the state last written was collected (routing clock)
        self.restored = 0  # route statistics entries the last restore brought back
        router.stats.changed = {key for key, _ in router.stats}  # the rows to save next
        self._retry: set[tuple[str, str]] = set()  # routes of failed writes
        self._versions: dict[str, int] = {}  # topology version per model as last written
        self._unsettled: dict[str, SavedTopology] = {}  # saved change times not yet given back
        self._settle_until = -math.inf
        self._failing = False  # the last write failed (the next provider snapshot is whole)
        self._pruned_at = -math.inf
        self._warned_at = -math.inf
        self._unreported = 0  # failures since the last warning

    def restore(self, now: float) -> int:
        """Take back what the file holds (call after static nodes are loaded); how many route
        statistics entries came back. StateStoreError names a file that cannot be used."""
        saved = self.store.load_routes()
        stats = self.router.stats
        unsaved, stats.changed = stats.changed, None  # what comes from the file stays there
        restored = self.restored = stats.restore(saved.entries, now)
        stats.changed = unsaved
        self._unsettled = dict(saved.topology)
        self._settle_until = now + SETTLE_S
        self.settle(now)
        if self.providers is not None:
            try:
                self.providers.restore(self.store.load())
            except ValueError as exc:
                raise StateStoreError(f"state file {self.store.path}: {exc}") from exc
        return restored

    def settle(self, now: float) -> int:
        """Give each model whose node set is back exactly as saved its saved topology change
        time: the restart re-joined its nodes, it did not change them, so statistics measured
        since that time are not stale. How many models were settled."""
        if now > self._settle_until:
            self._unsettled.clear()
        settled = 0
        for name, saved in list(self._unsettled.items()):
            model = self.router.topology.model(name)
            if model is None or topology_of(model) != saved.nodes:
                continue
            model.changed_at = min(model.changed_at, saved.changed_at)
            del self._unsettled[name]
            self._versions.pop(name, None)  # written again with the change time given back
            settled += 1
        return settled

    def collect(self, now: float) -> Pending | None:
        """What changed since the last good write (None: nothing); runs on the event loop and
        costs in proportion to what changed, not to what the tracker holds."""
        self.settle(now)
        stats = self.router.stats
        keys = self._retry
        if stats.changed:
            keys = keys | stats.changed
            stats.changed = set()
        self._retry = set()
        entries = {(m, s, o): e for m, s in keys for o, e in stats.entries(m, s).items()}
        topology, versions = {}, {}
        for name in self.router.topology.models():
            model = self.router.topology.model(name)
            if (model is None or self._versions.get(name) == model.version
                    or not math.isfinite(model.changed_at)):
                continue
            topology[name] = SavedTopology(model.changed_at, topology_of(model))
            versions[name] = model.version
        providers = ({} if self.providers is None else
                     self.providers.snapshot(now, changed_only=not self._failing))
        prune = (now - stats.prune_after_s
                 if now - self._pruned_at >= PRUNE_FILE_EVERY_S else -math.inf)
        if not (entries or topology or any(providers.values()) or math.isfinite(prune)):
            return None
        return Pending(now, providers, RouteRows(entries, topology, stats.origin, prune), keys,
                       versions)

    def write(self, pending: Pending) -> StateStoreError | None:
        """Write one collected change (in a worker thread); the error if it failed."""
        try:
            self.store.save(pending.providers, pending.now, pending.routes)
        except StateStoreError as exc:
            return exc
        return None

    def done(self, pending: Pending, error: StateStoreError | None, now: float) -> None:
        """Account for a write: a good one becomes the baseline, a failed one is counted,
        logged (rate-limited) and left to the next interval."""
        if error is None:
            self.writes += 1
            self.saved_at = pending.now
            self._versions.update(pending.versions)
            self._failing = False
            if math.isfinite(pending.routes.prune_before):
                self._pruned_at = pending.now
            if self._unreported or math.isfinite(self._warned_at):
                log.warning("state file %s written again (%d failed writes since the last "
                            "warning)", self.store.path, self._unreported)
                self._unreported, self._warned_at = 0, -math.inf
            return
        self.write_errors += 1
        self._failing = True
        self._retry |= pending.keys
        self._unreported += 1
        if now - self._warned_at >= WARN_EVERY_S:
            log.warning("%s; routing goes on, the write is retried every %g s (%d failed "
                        "writes in all; this warning repeats at most every %g s)",
                        error, SAVE_EVERY_S, self.write_errors, WARN_EVERY_S)
            self._warned_at, self._unreported = now, 0

    def save_now(self, now: float) -> bool:
        """Collect and write at once, on this thread (shutdown, tests); whether it was saved."""
        pending = self.collect(now)
        if pending is None:
            if not self._failing:
                self.saved_at = now  # nothing to write: the file is current as of now
            return not self._failing
        error = self.write(pending)
        self.done(pending, error, now)
        return error is None

    async def run(self, clock: Callable[[], float]) -> None:
        """Save every SAVE_EVERY_S until cancelled, then a last time, and close the file (an
        unexpected error leaves it open, so that the loop can be run again)."""
        try:
            while True:
                await anyio.sleep(SAVE_EVERY_S)
                now = clock()
                pending = self.collect(now)
                if pending is not None:
                    error = await anyio.to_thread.run_sync(self.write, pending)
                    self.done(pending, error, clock())
                elif not self._failing:
                    self.saved_at = now  # nothing changed: the file is current as of now
        except Exception:
            raise  # unexpected: the supervisor (app/supervise.py) runs it again, file open
        except BaseException:  # cancelled: the gateway stops; a last save, then close
            if not self.save_now(clock()):
                log.error("state file %s: the last changes were not saved at shutdown",
                          self.store.path)
            self.store.close()
            raise

    def metric_families(self) -> Iterator[Metric]:
        """The state file's counters, for /metrics."""
        writes = CounterMetricFamily("meshroute_state_writes",
                                     "State file transactions committed")
        writes.add_metric([], self.writes)
        errors = CounterMetricFamily("meshroute_state_write_errors",
                                     "State file writes that failed (full disk, read-only "
                                     "file); each is retried at the next interval")
        errors.add_metric([], self.write_errors)
        failing = GaugeMetricFamily("meshroute_state_unsaved",
                                    "1 while the last state file write failed, else 0")
        failing.add_metric([], 1 if self._failing else 0)
        current = GaugeMetricFamily("meshroute_state_current_timestamp_seconds",
                                    "The state file holds everything learned up to this time")
        if math.isfinite(self.saved_at):
            current.add_metric([], self.saved_at)
        yield from (writes, errors, failing, current)
