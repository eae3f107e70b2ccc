"""Smoke tests of the load benchmark's harness (benchmarks/_load.py, the loop-lag hook):
fast, loopback only, no wall-clock upper bounds."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from benchmarks import _load as L
from benchmarks import _procs as P

pytestmark = pytest.mark.anyio


async def _sse(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    if body.get("model") == "broken":
        payload = {"error": {"message": "every route failed", "routes": {"r1": "refused"}}}
        return web.json_response(payload, status=503)
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    for i in range(3):
        await resp.write(b'data: {"choices":[{"delta":{"content":"t%d"}}]}\n\n' % i)
    if body.get("model") != "truncated":
        await resp.write(b"data: [DONE]\n\n")
    return resp


@pytest.fixture
async def sse_url() -> AsyncIterator[str]:
    app = web.Application()
    app.router.add_post("/v1/chat/completions", _sse)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}/v1/chat/completions"
    await runner.cleanup()


@pytest.mark.parametrize(("model", "ok"), [("m", True), ("truncated", False),
                                           ("broken", False)])
async def test_hold_streams_counts_whole_streams_only(sse_url: str, model: str,
                                                      ok: bool) -> None:
    out = await L.hold_streams(sse_url, {"model": model, "stream": True}, streams=4,
                               seconds=0.2, ramp_s=0.05)
    assert out["streams_started"] >= 4
    assert out["streams_ok"] + out["streams_failed"] == out["streams_started"]
    if ok:
        assert out["streams_failed"] == 0
        assert out["chunks"] == 3 * out["streams_ok"]
        assert out["ttft_p50_ms"] > 0
    else:
        assert out["streams_ok"] == 0
        assert sum(out["errors"].values()) == out["streams_failed"]
    if model == "broken":
        assert any("status 503" in e and "refused" in e for e in out["errors"])
        assert out["peak_open_streams"] == 0


def test_percentile_and_rss_trend() -> None:
    assert L.pct([5.0, 1.0, 3.0, 2.0, 4.0], 50) == 3.0
    assert L.pct([1.0, 2.0], 100) == 2.0
    flat = [(float(t), 80.0) for t in range(60)]
    growing = [(float(t), 80.0 + t / 6) for t in range(60)]
    assert L.median_of([{"a": 1.0}, {"a": 3.0}, {"a": 2.0}]) == {"a": 2.0}
    from benchmarks.bench_load import rss_trend
    assert rss_trend(flat)["rss_growth_after_warmup_mb"] == 0.0
    assert rss_trend(growing)["rss_slope_mb_per_min"] == pytest.approx(10.0)
    assert rss_trend(growing)["rss_growth_after_warmup_mb"] > 8


def test_wrk_script_posts_the_body_and_reports_json() -> None:
    script = L.wrk_script('{"model": "m"}', {"Authorization": "Bearer x"})
    assert 'wrk.method = "POST"' in script
    assert 'wrk.body = "{\\"model\\": \\"m\\"}"' in script
    assert 'wrk.headers["Authorization"] = "Bearer x"' in script
    assert "WRKJSON" in script and "percentile(99)" in script


def test_hook_window_sums_lines_in_the_window(tmp_path: Path) -> None:
    path = tmp_path / "hook.jsonl"
    lines = [{"t": t, "beats": 100, "lag_max_ms": lag, "over_50ms": int(lag > 50),
              "cpu_lag_max_ms": lag / 2, "cpu_over_50ms": 0, "gc_total_ms": 10.0 * t,
              "gc_pauses": [[2, lag, 0, lag / 2, 1000]] if lag > 50 else []}
             for t, lag in ((1.0, 5.0), (2.0, 80.0), (3.0, 7.0), (9.0, 500.0))]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    out = L.hook_window(path, 0.5, 3.0)
    assert out["loop_lag_max_ms"] == 80.0
    assert out["loop_lags_over_50ms"] == 1
    assert out["loop_beats"] == 300
    assert out["gc_ms"] == 20.0
    assert out["gc_gen2_pauses"] == [{"wall_ms": 80.0, "cpu_ms": 40.0, "collected": 0,
                                      "tracked_after": 1000}]


BLOCKER = """
import asyncio, time
def burn():  # 0.25 s of this thread's CPU in one callback: a stall of the loop
    end = time.thread_time() + 0.25
    while time.thread_time() < end:
        pass
async def main():
    await asyncio.sleep(0.3)
    asyncio.get_running_loop().call_soon(burn)
    await asyncio.sleep(0.3)
asyncio.run(main())
"""


def test_loop_hook_sees_a_blocking_callback(tmp_path: Path) -> None:
    out = tmp_path / "hook.jsonl"
    env = {**os.environ, "PYTHONPATH": str(P.HOOKS), "MESHROUTE_BENCH_HOOK_OUT": str(out)}
    subprocess.run([sys.executable, "-c", BLOCKER], env=env, check=True, timeout=60)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert sum(x["beats"] for x in lines) > 0
    # a beat posted while burn() ran landed after it: at least its remaining CPU time late
    assert max(x["cpu_lag_max_ms"] or 0 for x in lines) >= 200
    assert max(x["lag_max_ms"] or 0 for x in lines) >= 200


def test_hook_is_inert_without_its_variable() -> None:
    env = {k: v for k, v in os.environ.items() if k != "MESHROUTE_BENCH_HOOK_OUT"}
    env["PYTHONPATH"] = str(P.HOOKS)
    code = "import asyncio, threading; asyncio.new_event_loop(); print(threading.active_count())"
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "1"


async def test_measure_adds_window_and_cpu() -> None:
    async def load() -> dict[str, float]:
        await asyncio.sleep(0)
        return {"requests": 1}
    out = await L.measure(load(), os.getpid())
    assert out["requests"] == 1
    t0, t1 = out["window"]
    assert t1 >= t0
    assert out["server_cpu_s"] >= 0


COLLECTOR = """
import asyncio, gc, os, pathlib
class Blob:  # each holds a list: the list has no source of its own, it takes its owner's
    def __init__(self):
        self.items = [object()]
async def main():
    loop = asyncio.get_running_loop()
    heap = [[{}] for _ in range(200_000)]  # a full collection of this takes milliseconds
    gc.collect()  # in the loop's thread
    blobs = [Blob() for _ in range(500)]
    pathlib.Path(os.environ["MESHROUTE_BENCH_HOOK_OUT"] + ".census").write_text("probe")
    out = pathlib.Path(os.environ["MESHROUTE_BENCH_HOOK_OUT"] + ".census-probe.json")
    for _ in range(300):  # the heartbeat thread looks for a request once a second
        if out.exists():
            break
        await asyncio.sleep(0.05)
    return heap, blobs
asyncio.run(main())
"""


def test_loop_hook_times_collections_by_wall_and_cpu_and_takes_a_census(
        tmp_path: Path) -> None:
    out = tmp_path / "hook.jsonl"
    env = {**os.environ, "PYTHONPATH": str(P.HOOKS), "MESHROUTE_BENCH_HOOK_OUT": str(out),
           "MESHROUTE_BENCH_GC_COUNT": "1"}
    subprocess.run([sys.executable, "-c", COLLECTOR], env=env, check=True, timeout=120)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    full = [p for x in lines for p in x["gc_pauses"] if p[0] == 2]
    assert full, lines
    _gen, wall_ms, _collected, cpu_ms, tracked, uncollectable, in_loop, count_ms = max(
        full, key=lambda p: p[4])
    assert wall_ms > 0 and 0 < cpu_ms <= wall_ms + 1.0  # one thread: CPU never exceeds wall
    assert tracked >= 200_000 and uncollectable == 0 and in_loop == 1 and count_ms >= 0
    assert sum(x["gc"]["n"][2] for x in lines) >= 1
    assert max(x["gc"]["cpu_ms_max"][2] for x in lines) >= cpu_ms
    window = L.hook_window(out, 0, 2e9)
    assert window["gc_pause_cpu_max_ms"] >= cpu_ms and window["gc_pause_max_ms"] >= wall_ms
    assert window["gc_by_generation"]["n"][2] >= 1
    census = json.loads((tmp_path / "hook.jsonl.census-probe.json").read_text())
    assert census["full_collection_cpu_ms"] > 0 and census["tracked"] >= 200_000
    kinds = census["by_source_type"]
    assert kinds["other | __main__.Blob"] == 500
    assert kinds["other | list"] >= 500  # each Blob's list, attributed to its owner


GIL_HOLDER = """
import asyncio, json, os, time
def hold():  # one C call that never lets go of the GIL (as a garbage collection does)
    began = time.perf_counter()
    sum(range(10**8))
    print(round((time.perf_counter() - began) * 1e3))
def beating():  # the hook has written a line with beats: its heartbeat thread runs
    try:
        with open(os.environ["MESHROUTE_BENCH_HOOK_OUT"]) as f:
            return any(json.loads(line)["beats"] for line in f)
    except FileNotFoundError:
        return False
async def main():
    while not beating():  # a loaded machine may start the heartbeat late
        await asyncio.sleep(0.05)
    asyncio.get_running_loop().call_soon(hold)
    await asyncio.sleep(0)  # hold runs here; the heartbeat thread then records how late it
    await asyncio.sleep(0.3)  # woke before the process exits (a timer set before hold had
asyncio.run(main())  # already expired when hold returned: exit raced the late sample)
"""


def test_heartbeat_lateness_sees_a_stall_that_holds_the_gil(tmp_path: Path) -> None:
    out = tmp_path / "hook.jsonl"
    env = {**os.environ, "PYTHONPATH": str(P.HOOKS), "MESHROUTE_BENCH_HOOK_OUT": str(out)}
    held_ms = int(subprocess.run([sys.executable, "-c", GIL_HOLDER], env=env, check=True,
                                 capture_output=True, text=True, timeout=120).stdout)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    # the heartbeat thread slept through it, waiting for the GIL: late by most of it
    assert max(x["beat_late_max_ms"] or 0 for x in lines) >= 0.5 * held_ms, lines
    assert L.hook_window(out, 0, 2e9)["heartbeat_late_max_ms"] >= 0.5 * held_ms
