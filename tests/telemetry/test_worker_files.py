"""Several workers' metrics as one gateway's (worker_files.py, workers.py), in one process:
each worker is a WorkerFiles (or a Telemetry joined to the run's directory) of its own pid."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from meshroute_middleware.core.objectives import COST, THROUGHPUT
from meshroute_middleware.middleware import build_router
from meshroute_middleware.telemetry import workers
from meshroute_middleware.telemetry.metrics import Telemetry
from meshroute_middleware.telemetry.requests import RequestTally
from meshroute_middleware.telemetry.worker_files import WorkerFiles, without_label, worker_ended
from meshroute_middleware.telemetry.workers import WorkerMetrics
from tests.conftest import FakeClock


def _families(decisions: float, in_flight: float, up: float, odd: float,
              buckets: list[tuple[str, float]], total_s: float) -> list[Metric]:
    counter = CounterMetricFamily("meshroute_decisions", "d", labels=["model"])
    counter.add_metric(["m"], decisions)
    flying = GaugeMetricFamily("meshroute_in_flight", "f")
    flying.add_metric([], in_flight)
    service = GaugeMetricFamily("meshroute_service_up", "u", labels=["service"])
    service.add_metric(["gossip"], up)
    unlisted = GaugeMetricFamily("meshroute_unlisted", "o")
    unlisted.add_metric([], odd)
    latency = HistogramMetricFamily("meshroute_limits_store_seconds", "l")
    latency.add_metric([], buckets, total_s)
    return [counter, flying, service, unlisted, latency]


def _samples(metrics: list[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for m in metrics
            for s in m.samples}


def test_counters_sum_gauges_by_their_mode_histograms_add_up(tmp_path: Path) -> None:
    a, b = WorkerFiles(tmp_path, 101), WorkerFiles(tmp_path, 102)
    a.write(_families(3, 2, 1, 7, [("0.1", 1), ("+Inf", 4)], 0.5), 1.0)
    b.write(_families(5, 1, 0, 9, [("0.1", 2), ("+Inf", 2)], 0.25), 1.0)
    got = _samples(a.merged())
    assert got[("meshroute_decisions_total", (("model", "m"),))] == 8
    assert got[("meshroute_in_flight", ())] == 3  # livesum
    assert got[("meshroute_service_up", (("service", "gossip"),))] == 0  # livemin
    assert got[("meshroute_unlisted", (("pid", "101"),))] == 7  # unlisted: per worker
    assert got[("meshroute_unlisted", (("pid", "102"),))] == 9
    assert got[("meshroute_limits_store_seconds_bucket", (("le", "0.1"),))] == 3
    assert got[("meshroute_limits_store_seconds_bucket", (("le", "+Inf"),))] == 6
    assert got[("meshroute_limits_store_seconds_count", ())] == 6
    assert got[("meshroute_limits_store_seconds_sum", ())] == 0.75


def test_an_ended_worker_keeps_its_counts_and_leaves_the_live_gauges(tmp_path: Path) -> None:
    a, b = WorkerFiles(tmp_path, 101), WorkerFiles(tmp_path, 102)
    a.write(_families(3, 2, 1, 7, [("+Inf", 0)], 0), 1.0)
    b.write(_families(5, 1, 1, 9, [("+Inf", 0)], 0), 1.0)
    worker_ended(tmp_path, 102)
    got = _samples(a.merged())
    assert got[("meshroute_decisions_total", (("model", "m"),))] == 8
    assert got[("meshroute_in_flight", ())] == 2
    assert ("meshroute_unlisted", (("pid", "102"),)) not in got


def test_a_series_a_worker_forgot_leaves_the_merge(tmp_path: Path) -> None:
    """A gone model's series leave /metrics (issue 22): a rewrite drops them from the file."""
    a = WorkerFiles(tmp_path, 101)
    a.write(_families(3, 0, 1, 0, [("+Inf", 0)], 0), 1.0)
    a.write([], 2.0)
    assert not any(m.samples for m in a.merged())


def test_without_label_sums_the_clients() -> None:
    family = CounterMetricFamily("meshroute_client_requests", "r",
                                 labels=["client", "route", "status"])
    family.add_metric(["alice", "r", "200"], 2)
    family.add_metric(["bob", "r", "200"], 3)
    family.add_metric(["bob", "r", "429"], 1)
    got = _samples([without_label(family, "client")])
    assert got == {("meshroute_client_requests_total", (("route", "r"), ("status", "200"))): 5,
                   ("meshroute_client_requests_total", (("route", "r"), ("status", "429"))): 1}


def _worker(tmp_path: Path, pid: int, clock: FakeClock) -> Telemetry:
    telemetry = Telemetry(build_router(clock=FakeClock()))
    telemetry.requests = RequestTally()
    metrics = WorkerMetrics(WorkerFiles(tmp_path, pid), clock=clock)
    telemetry.workers = metrics
    telemetry.requests.gateway = lambda: metrics.counts(telemetry).requests
    return telemetry


def _answered(exposition: bytes) -> float:
    return sum(s.value for f in text_string_to_metric_families(exposition.decode())
               for s in f.samples if s.name == "meshroute_requests_total"
               and s.labels["result"] == "answered")


def test_scrapes_alternating_between_workers_never_go_back(tmp_path: Path) -> None:
    """a answers a scrape, b then a newer one, then a again within the render cache's second:
    the cache is the gateway's (the newest exposition any worker made), not a's own older
    one, so the third scrape does not go back."""
    clock = FakeClock()
    a, b = _worker(tmp_path, 101, clock), _worker(tmp_path, 102, clock)
    seen = []
    for step in range(9):
        for w in (a, b):
            assert w.requests is not None and w.workers is not None
            w.requests.answered += 1
            w.asked(THROUGHPUT if step % 2 else COST)
            w.workers.sync(w)  # each worker's periodic write
        seen.append(_answered((a, b)[step % 2].render_cached(clock(), 1.0)))
        clock.advance(0.4)
    assert seen == sorted(seen) and len(set(seen)) < len(seen), seen  # some from the cache
    clock.advance(1.0)
    assert _answered(a.render_cached(clock(), 1.0)) == 18
    assert a.requests is not None and b.requests is not None
    assert a.requests.to_dict() == b.requests.to_dict() == {"answered": 18, "failed": 0}
    assert a.objectives == b.objectives
    assert a.objectives[THROUGHPUT] == 8 and a.objectives[COST] == 10


def test_a_client_less_scrape_sums_each_clients_spend(tmp_path: Path) -> None:
    clock = FakeClock()
    a, b = _worker(tmp_path, 101, clock), _worker(tmp_path, 102, clock)
    for telemetry, client in ((a, "alice"), (b, "bob")):
        family = CounterMetricFamily("meshroute_client_requests", "r",
                                     labels=["client", "route", "status"])
        family.add_metric([client, "r", "200"], 2)
        telemetry.add_client_collector(lambda f=family: [f], list)
    b.workers.sync(b)  # type: ignore[union-attr]
    text = a.render(per_client=False).decode()
    assert 'meshroute_client_requests_total{route="r",status="200"} 4.0' in text
    assert "alice" not in text
    assert 'client="alice"' in a.render(per_client=True).decode()


def test_a_killed_runs_directory_is_swept_by_the_next_run(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(workers, "SHM", str(tmp_path / "none"))  # the temporary directory
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = tmp_path / (workers.PREFIX + "gone")
    gone.mkdir()
    (gone / "parent").write_text(str(dead.pid))
    alive = tmp_path / (workers.PREFIX + "alive")
    alive.mkdir()
    (alive / "parent").write_text(str(os.getpid()))
    run = workers.WorkersDir.create(2)
    assert run.path.parent == tmp_path and (run.path / "parent").read_text() == str(os.getpid())
    assert not gone.exists() and alive.exists()
    run.remove()
    assert not run.path.exists()
