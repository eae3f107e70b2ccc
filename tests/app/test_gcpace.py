"""The garbage-collector pacer of `meshroute serve` (app/gcpace.py): which generation each
tick collects, when a full collection runs, waits or is forced; with a fake clock, a fake
collector and a fake heap. `settle` and the served process are checked in processes of their
own (they change the collector process-wide)."""

from __future__ import annotations

import gc
import json
import logging
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import httpx
import pytest

from meshroute_middleware.app.gcpace import FULL, MIDDLE, YOUNG, GcPacer, GcPacing
from meshroute_middleware.app.settings import SettingsError, load_settings

from ..upstream import serve_process

BASE = 100_000  # blocks of the (fake) frozen start-up heap


class FakeGc:
    """A collector whose full collections cost `s_per_block` per heap block above BASE."""

    def __init__(self, heap: int = 0, s_per_block: float = 0.3e-6) -> None:
        self.now = 0.0  # the scheduling clock
        self.cpu = 0.0  # the pause timer
        self.heap = heap  # blocks above BASE
        self.s_per_block = s_per_block
        self.runs: list[int] = []

    def collect(self, generation: int) -> int:
        self.runs.append(generation)
        self.cpu += self.s_per_block * self.heap if generation == FULL else 1e-4
        return 0

    def pacer(self, **pacing: float) -> GcPacer:
        pacer = GcPacer(GcPacing(**pacing), clock=lambda: self.now, timer=lambda: self.cpu,
                        collect=self.collect, heap_blocks=lambda: BASE + self.heap)
        pacer._base = BASE  # what settle() would read
        return pacer

    def ticks(self, pacer: GcPacer, n: int) -> list[int]:
        out = []
        for _ in range(n):
            self.now += pacer.pacing.young_every_s
            out.append(pacer.tick())
        return out

    def run_for(self, pacer: GcPacer, seconds: float) -> list[int]:
        return self.ticks(pacer, round(seconds / pacer.pacing.young_every_s))


def test_young_on_every_tick_and_middle_instead_of_every_eighth() -> None:
    fake = FakeGc()
    pacer = fake.pacer()
    assert fake.ticks(pacer, 24) == ([YOUNG] * 7 + [MIDDLE]) * 3
    assert fake.runs == ([0] * 7 + [1]) * 3
    assert pacer.collections == [21, 3, 0]


def test_a_full_collection_is_due_a_minute_after_the_last_and_runs_when_cheap() -> None:
    fake = FakeGc(heap=20_000)  # 20,000 blocks at >= 0.5 us: 10 ms predicted, budget 20
    pacer = fake.pacer()
    assert FULL not in fake.run_for(pacer, 59.8)
    assert FULL in fake.run_for(pacer, 0.4)  # at the first middle tick from 60 s
    assert pacer.collections[FULL] == 1
    assert pacer.longest_s[FULL] == pytest.approx(0.3e-6 * 20_000)
    assert FULL not in fake.run_for(pacer, 59.5)  # not due again for a minute


def test_a_due_full_collection_waits_while_the_heap_is_large_and_runs_when_it_shrinks() -> None:
    fake = FakeGc(heap=300_000)  # 1,000 streams open: 150 ms predicted
    pacer = fake.pacer()
    fake.run_for(pacer, 120.0)
    assert pacer.collections[FULL] == 0 and pacer.deferred == 60 * 5  # one a middle tick
    assert max(pacer.longest_s) < 0.001  # only short pauses
    fake.heap = 30_000  # the load fell
    assert FULL in fake.ticks(pacer, 8)
    assert pacer.longest_s[FULL] == pytest.approx(0.3e-6 * 30_000)


def test_a_slow_full_collection_raises_the_estimate_and_the_next_waits_for_a_smaller_heap(
) -> None:
    fake = FakeGc(heap=35_000, s_per_block=0.55e-6)  # slower than the floor says: 19.25 ms
    pacer = fake.pacer()
    fake.run_for(pacer, 60.2)
    assert pacer.collections[FULL] == 1  # predicted 17.5 ms; took 19.25
    assert pacer.predicted_full_s(35_000) == pytest.approx(0.55e-6 * 35_000)
    fake.heap = 37_000  # 18.5 ms by the floor, 20.35 ms by what was measured: waits
    fake.run_for(pacer, 120.0)
    assert pacer.collections[FULL] == 1
    fake.heap = 30_000
    fake.run_for(pacer, 0.2)
    assert pacer.collections[FULL] == 2


def test_a_full_collection_on_a_tiny_heap_teaches_no_rate() -> None:
    fake = FakeGc(heap=500)
    pacer = fake.pacer()
    fake.cpu = 0.0
    fake.s_per_block = 1e-5  # the collector's fixed cost, spread over few blocks
    fake.run_for(pacer, 60.2)
    assert pacer.collections[FULL] == 1
    assert pacer.predicted_full_s(30_000) == pytest.approx(0.5e-6 * 30_000)  # the floor


def test_the_safety_net_forces_a_full_collection_when_the_heap_grew_and_logs_it(
        caplog: pytest.LogCaptureFixture) -> None:
    fake = FakeGc(heap=20_000)
    pacer = fake.pacer(force_after_s=600.0)
    fake.run_for(pacer, 60.2)
    assert pacer.collections[FULL] == 1  # cheap, at 60 s; then the heap grows for good
    fake.heap = 200_000
    with caplog.at_level(logging.WARNING, logger="meshroute.gc"):
        fake.run_for(pacer, 599.0)  # ten minutes since, not quite
        assert pacer.forced == 0
        fake.run_for(pacer, 1.2)
    assert pacer.collections[FULL] == 2 and pacer.forced == 1
    assert "ran over its budget" in caplog.text and "200000" in caplog.text
    # the heap it left is the new reference: steady from here, nothing more is forced
    fake.run_for(pacer, 1200.0)
    assert pacer.forced == 1 and pacer.collections[FULL] == 2


def test_a_steady_heap_is_never_forced() -> None:
    fake = FakeGc(heap=300_000)  # high load from the start: the heap never grows past it
    pacer = fake.pacer(force_after_s=600.0)
    pacer._heap_after_full = 300_000  # as if the last full collection ran at this load
    fake.run_for(pacer, 1800.0)
    assert pacer.collections[FULL] == 0 and pacer.forced == 0


def test_a_failing_tick_hands_the_collector_back_to_cpython_and_serving_goes_on(
        caplog: pytest.LogCaptureFixture) -> None:
    def broken(generation: int) -> int:
        raise RuntimeError("a bug in the pacer")

    pacer = GcPacer(GcPacing(young_every_s=0.001), collect=broken)
    saved = gc.get_threshold()
    gc.set_threshold(10_000, 1 << 30, 1 << 30)  # as settle() leaves it
    try:
        with caplog.at_level(logging.ERROR, logger="meshroute.gc"):
            anyio.run(pacer.run)  # returns instead of raising into the server's task group
        assert gc.get_threshold() == (700, 10, 100)
    finally:
        gc.set_threshold(*saved)
    assert "CPython's own collector takes over" in caplog.text


def test_the_gc_setting_takes_paced_or_python_and_nothing_else() -> None:
    assert load_settings({}, {}).gc == "paced"
    assert load_settings({"gc": "python"}, {}).gc == "python"
    assert load_settings({}, {"MESHROUTE_GC": "python"}).gc == "python"
    with pytest.raises(SettingsError, match="gc must be one of paced, python"):
        load_settings({"gc": "fast"}, {})


@pytest.mark.parametrize("bad", [{"young_every_s": 0}, {"middle_every": 0},
                                 {"force_growth": 0.5}, {"pause_budget_s": -1.0},
                                 {"min_s_per_block": float("nan")}])
def test_pacing_refuses_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        GcPacing(**bad)  # type: ignore[arg-type]


def test_metric_families_name_every_generation() -> None:
    fake = FakeGc()
    pacer = fake.pacer()
    fake.ticks(pacer, 8)
    families = {m.name: m for m in pacer.metric_families()}
    runs = {s.labels["generation"]: s.value for s in families["meshroute_gc_collections"].samples}
    assert runs == {"young": 7, "middle": 1, "full": 0}
    assert {"meshroute_gc_pause_max_seconds", "meshroute_gc_full_deferred",
            "meshroute_gc_full_forced"} <= set(families)


SETTLE = """
import gc, json
from meshroute_middleware.app.gcpace import GcPacer
garbage = [[]]
garbage[0].append(garbage)  # a reference cycle nobody holds: settle collects it
del garbage
GcPacer().settle()
print(json.dumps({"threshold": gc.get_threshold(), "frozen": gc.get_freeze_count(),
                  "left": len(gc.get_objects()), "enabled": gc.isenabled()}))
"""


def test_settle_freezes_the_start_up_heap_and_leaves_cpython_only_a_young_backstop() -> None:
    out = subprocess.run([sys.executable, "-c", SETTLE], check=True, capture_output=True,
                         text=True, timeout=120)
    got = json.loads(out.stdout)
    young, middle, full = got["threshold"]
    assert young == GcPacing().backstop and middle >= 1 << 30 and full >= 1 << 30
    assert got["enabled"]  # the backstop still fires on its own
    assert got["frozen"] > 10_000 and got["left"] < 100


def young_collections(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    found = re.search(r'^meshroute_gc_collections_total\{generation="young"\} (\S+)$', text,
                      re.MULTILINE)
    assert found, "no meshroute_gc_collections in /metrics"
    return float(found.group(1))


def test_serve_paces_its_collector_on_its_loop_and_stops_cleanly(tmp_path: Path) -> None:
    with serve_process([], tmp_path / "serve.log") as (url, proc):
        first = young_collections(url)
        deadline = time.monotonic() + 30.0
        while young_collections(url) <= first:  # the ticks go on while it serves
            assert time.monotonic() < deadline, "no young collection in 30 s"
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) in (0, 130)
    assert "Traceback" not in (tmp_path / "serve.log").read_text()


def test_serve_gc_python_leaves_cpython_its_own_collector(tmp_path: Path) -> None:
    with serve_process(["--gc", "python"], tmp_path / "serve.log") as (url, _):
        assert "meshroute_gc_collections" not in httpx.get(f"{url}/metrics", timeout=5).text
