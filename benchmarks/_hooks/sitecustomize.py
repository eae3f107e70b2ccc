"""A debug hook the load benchmark puts on a server's PYTHONPATH: event-loop lag and GC pauses.

Inert unless MESHROUTE_BENCH_HOOK_OUT names a file. Then:
- every event loop made by `uvloop.new_event_loop` or `asyncio.new_event_loop` gets a
  heartbeat thread that posts a callback every MESHROUTE_BENCH_HOOK_INTERVAL_S (0.01) with
  `call_soon_threadsafe` and measures how late it runs: the loop's lag, i.e. how long the loop
  was busy with other callbacks (one long callback is a stall), and how much CPU time the
  loop's thread used meanwhile (read with pthread_getcpuclockid): a lag with as much CPU is
  the server's own work, a lag without is time it waited for a core (a loaded machine);
- `gc.callbacks` times every garbage collection.
Once a second it appends one JSON line: wall time, heartbeats, their max and p99 lag (ms),
how many were over 50 ms, and the GC pauses over 5 ms: generation, wall ms, objects collected,
CPU ms of the collecting thread (wall much above CPU: the process was waiting for a core),
objects tracked after a full collection (-1 for the younger generations).
Nothing of the server is imported or changed; the cost is one wake-up of the loop per beat.
As experiments only: MESHROUTE_BENCH_GC_THRESHOLD="g0,g1,g2" sets the GC thresholds;
MESHROUTE_BENCH_GC_FREEZE_AFTER_S=S calls gc.freeze() on the loop S seconds after it is made
(the start-up heap then leaves the collections).
"""

from __future__ import annotations

import asyncio
import atexit
import gc
import json
import os
import threading
import time
from typing import Any

OUT = os.environ.get("MESHROUTE_BENCH_HOOK_OUT")
INTERVAL_S = float(os.environ.get("MESHROUTE_BENCH_HOOK_INTERVAL_S", "0.01"))
GC_REPORT_MS = 5.0


class _Recorder:
    def __init__(self, path: str) -> None:
        self.path = path
        self.lags_ms: list[float] = []
        self.cpu_lags_ms: list[float] = []  # CPU time the loop's thread used during each lag
        self.gcs: list[tuple[int, float, int, float, int]] = []
        self.gc_total_ms = 0.0
        self._gc_began = self._gc_cpu_began = 0.0
        self._lock = threading.Lock()

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        if phase == "start":
            self._gc_began, self._gc_cpu_began = now, cpu
            return
        pause_ms = (now - self._gc_began) * 1e3
        self.gc_total_ms += pause_ms
        if pause_ms >= GC_REPORT_MS:
            tracked = len(gc.get_objects()) if info["generation"] == 2 else -1
            self.gcs.append((info["generation"], round(pause_ms, 2), info["collected"],
                             round((cpu - self._gc_cpu_began) * 1e3, 2), tracked))

    def beat(self, loop: asyncio.AbstractEventLoop, loop_thread: int) -> None:
        clock = time.pthread_getcpuclockid(loop_thread)
        flushed = began = time.monotonic()
        freeze_after_s = float(os.environ.get("MESHROUTE_BENCH_GC_FREEZE_AFTER_S") or "inf")
        while not loop.is_closed():
            if time.monotonic() - began >= freeze_after_s:  # an experiment, off by default
                loop.call_soon_threadsafe(gc.freeze)
                freeze_after_s = float("inf")
            posted, posted_cpu = time.perf_counter(), time.clock_gettime(clock)
            try:
                loop.call_soon_threadsafe(self._landed, posted, posted_cpu)
            except RuntimeError:  # the loop closed meanwhile
                return
            time.sleep(INTERVAL_S)
            if time.monotonic() - flushed >= 1.0:
                flushed = time.monotonic()
                self.flush()

    def _landed(self, posted: float, posted_cpu: float) -> None:
        lag_s, cpu_s = time.perf_counter() - posted, time.thread_time() - posted_cpu
        with self._lock:
            self.lags_ms.append(lag_s * 1e3)
            self.cpu_lags_ms.append(cpu_s * 1e3)

    def flush(self) -> None:
        with self._lock:
            lags, self.lags_ms = self.lags_ms, []
            cpu_lags, self.cpu_lags_ms = self.cpu_lags_ms, []
        gcs, self.gcs = self.gcs, []
        lags.sort()
        line = {"t": round(time.time(), 3), "beats": len(lags),
                "lag_max_ms": round(lags[-1], 2) if lags else None,
                "lag_p99_ms": round(lags[int(0.99 * (len(lags) - 1))], 2) if lags else None,
                "over_50ms": sum(x > 50 for x in lags),
                "cpu_lag_max_ms": round(max(cpu_lags), 2) if cpu_lags else None,
                "cpu_over_50ms": sum(x > 50 for x in cpu_lags),
                "gc_total_ms": round(self.gc_total_ms, 1),
                "gc_pauses": gcs}
        with open(self.path, "a") as out:
            out.write(json.dumps(line) + "\n")


def _install(path: str) -> None:
    recorder = _Recorder(path)
    gc.callbacks.append(recorder.on_gc)
    atexit.register(recorder.flush)  # the last second's beats too

    def watched(factory: Any) -> Any:
        def make(*args: Any, **kwargs: Any) -> Any:
            loop = factory(*args, **kwargs)
            threading.Thread(target=recorder.beat, args=(loop, threading.get_ident()),
                             daemon=True,
                             name="bench-loop-heartbeat").start()
            return loop
        return make

    asyncio.new_event_loop = asyncio.events.new_event_loop = watched(
        asyncio.events.new_event_loop)
    try:
        import uvloop
    except ImportError:
        return
    uvloop.new_event_loop = watched(uvloop.new_event_loop)


if OUT:
    _install(OUT)
    if os.environ.get("MESHROUTE_BENCH_GC_THRESHOLD"):  # an experiment, off by default
        gc.set_threshold(*(int(x) for x in os.environ["MESHROUTE_BENCH_GC_THRESHOLD"].split(",")))
