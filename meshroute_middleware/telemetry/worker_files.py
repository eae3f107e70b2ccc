"""The metrics of `meshroute serve --workers N` as one gateway: each worker writes its own
counters and gauges to files of prometheus-client's multiprocess format in a directory the
parent made for the run, and a scrape answered by any worker merges every worker's files
(prometheus_client's `MultiProcessCollector.merge`).

A worker rewrites its files whole (a new file renamed over the old one) every `SYNC_S` and
before it answers a scrape, so a reader sees one worker's snapshot or the next, never half of
one, and a series that left a worker (issue 22's forgotten models) leaves its file too. Every
scrape reads every worker's values from the files only (its own written first), so a counter
never goes backwards between two scrapes, whichever worker answers each: each worker's file
only grows. A worker that ended leaves its counter files (its counts stay in the sums) and
its `live*` gauge files are removed (`mark_process_dead`), as in prometheus-client's own
multiprocess mode.
"""

from __future__ import annotations

import contextlib
import glob
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client.metrics_core import Metric
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead

SYNC_S = 0.5  # how old a sibling's counts may be in a scrape (plus the 1 s render cache)

# How a gauge of several workers is shown (prometheus_client multiprocess modes; `live*`: a
# worker that ended no longer counts). A gauge not listed here is shown per worker (`liveall`,
# with a `pid` label): never wrong, only longer.
GAUGE_MODES: dict[str, str] = {
    "meshroute_in_flight": "livesum",  # requests being served, by the whole gateway
    "meshroute_route_in_flight": "livesum",  # attempts open on a route (/v1/routing)
    "meshroute_embeddings_route_in_flight": "livesum",  # embeddings' (/v1/routing)
    "meshroute_event_subscribers": "livesum",  # open event streams, on any worker
    "meshroute_service_up": "livemin",  # 0 while the service is restarting in any worker
    "meshroute_gossip_peers": "livemin",  # the worker knowing the fewest peers
    "meshroute_gc_pause_max_seconds": "livemax",  # the longest pause of any worker
    "meshroute_state_unsaved": "livemax",  # 1 while any worker's last state write failed
    "meshroute_state_current_timestamp_seconds": "livemin",  # saved up to the oldest worker
    "meshroute_limits_store_up": "livemin",  # 0 while any worker gates keys locally
    "meshroute_limits_trackers": "livemax",  # the store's count, as the workers last read it
}
DEFAULT_GAUGE_MODE = "liveall"


def _file_kind(metric: Metric) -> str | None:
    """The multiprocess file a family's samples go to (None: a type it does not merge)."""
    if metric.type == "gauge":
        return "gauge_" + GAUGE_MODES.get(metric.name, DEFAULT_GAUGE_MODE)
    if metric.type in ("counter", "histogram"):
        return metric.type
    return None


_Key = tuple[str, str, tuple[tuple[str, str], ...]]
MAX_KEYS = 100_000  # mmap keys remembered (their JSON costs ~5 µs to build); then forgotten


def _rows(metric: Metric, keys: dict[_Key, str]) -> Iterator[tuple[str, float]]:
    """(mmap key, value) of a family's samples as the multiprocess files keep them: counters
    without their `_created`, histograms per bucket (not cumulative) and their `_sum` (the
    merge adds the buckets up again and counts `_count` from them)."""
    previous: dict[tuple[tuple[str, str], ...], float] = {}
    for sample in metric.samples:
        if sample.name.endswith("_created") and metric.type != "gauge":
            continue
        if sample.name.endswith("_count") and metric.type == "histogram":
            continue
        labels = sample.labels
        value = sample.value
        if metric.type == "histogram" and sample.name.endswith("_bucket"):
            rest = tuple(sorted((k, v) for k, v in labels.items() if k != "le"))
            value, previous[rest] = value - previous.get(rest, 0.0), value
        cached = (metric.name, sample.name, tuple(labels.items()))
        key = keys.get(cached)
        if key is None:
            if len(keys) >= MAX_KEYS:
                keys.clear()
            names = sorted(labels)
            key = keys[cached] = mmap_key(metric.name, sample.name, names,
                                          [labels[n] for n in names], metric.documentation)
        yield key, value


class WorkerFiles:
    """One worker's files in the run's directory, and the merge of every worker's."""

    def __init__(self, directory: str | Path, pid: int) -> None:
        self.directory, self.pid = Path(directory), pid
        self.writes = 0  # files written
        self._written: dict[str, list[tuple[str, float]]] = {}  # by kind: what its file holds
        self._keys: dict[_Key, str] = {}

    def write(self, families: Iterable[Metric], now: float) -> None:
        """This worker's snapshot: one file per kind, each replaced whole when it changed."""
        rows: dict[str, list[tuple[str, float]]] = {}
        for metric in families:
            kind = _file_kind(metric)
            if kind is not None:
                rows.setdefault(kind, []).extend(_rows(metric, self._keys))
        for kind in {*rows, *self._written}:  # a kind now empty: its file emptied too
            new = rows.get(kind, [])
            if self._written.get(kind) != new:
                self._replace(f"{kind}_{self.pid}.db", new, now)
                self._written[kind] = new
                self.writes += 1

    def _replace(self, name: str, rows: list[tuple[str, float]], now: float) -> None:
        staging = self.directory / f".{name}.{os.getpid()}.tmp"  # not *.db: never merged
        with contextlib.suppress(FileNotFoundError):
            staging.unlink()
        table = MmapedDict(str(staging))  # type: ignore[no-untyped-call]
        try:
            for key, value in rows:
                table.write_value(key, value, now)  # type: ignore[no-untyped-call]
        finally:
            table.close()  # type: ignore[no-untyped-call]
        os.replace(staging, self.directory / name)

    def merged(self) -> list[Metric]:
        """Every worker's families merged: counters and histograms summed, gauges by their
        mode (GAUGE_MODES)."""
        files = glob.glob(str(self.directory / "*.db"))
        merged = MultiProcessCollector.merge(files, accumulate=True)  # type: ignore[no-untyped-call]
        return list(merged)

    def remove_live(self) -> None:
        """This worker ends: its live gauges leave the merge (its counters stay)."""
        mark_process_dead(self.pid, str(self.directory))  # type: ignore[no-untyped-call]


def worker_ended(directory: str | Path, pid: int) -> None:
    """A worker process ended (seen by its parent): its `live*` gauges leave the merge."""
    mark_process_dead(pid, str(directory))  # type: ignore[no-untyped-call]


def without_label(metric: Metric, label: str) -> Metric:
    """`metric` with `label` summed away (each client's spend shown as the clients' sum)."""
    out = Metric(metric.name, metric.documentation, metric.type)
    sums: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for sample in metric.samples:
        key = (sample.name, tuple(sorted((k, v) for k, v in sample.labels.items()
                                         if k != label)))
        sums[key] = sums.get(key, 0.0) + sample.value
    for (name, labels), value in sums.items():
        out.add_sample(name, dict(labels), value)
    return out
