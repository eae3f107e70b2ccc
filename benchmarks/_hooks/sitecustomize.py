"""A debug hook the load benchmark puts on a server's PYTHONPATH: event-loop lag and GC pauses.

Inert unless MESHROUTE_BENCH_HOOK_OUT names a file. Then:
- every event loop made by `uvloop.new_event_loop` or `asyncio.new_event_loop` gets a
  heartbeat thread that posts a callback every MESHROUTE_BENCH_HOOK_INTERVAL_S (0.01) with
  `call_soon_threadsafe` and measures how late it runs: the loop's lag, i.e. how long the loop
  was busy with other callbacks (one long callback is a stall), and how much CPU time the
  loop's thread used meanwhile (read with pthread_getcpuclockid): a lag with as much CPU is
  the server's own work, a lag without is time it waited for a core (a loaded machine);
- `gc.callbacks` times every garbage collection twice: wall clock (`perf_counter`) and the
  collecting thread's CPU time (`thread_time`: the callbacks run in the thread that collects,
  before and after it). Wall much above CPU: the process was waiting for a core mid-way.
Its lag cannot see a stall that holds the GIL, such as a garbage collection: while one runs
the heartbeat thread cannot post a beat either. So it also logs how late the heartbeat thread
itself woke from each sleep (`beat_late_max_ms`): that is the GIL held elsewhere, or no core.
Once a second it appends one JSON line: wall time, heartbeats, their max and p99 lag (ms),
how many were over 50 ms, the heartbeat's own lateness, per generation the number of
collections and their longest wall and CPU ms (`gc`), and each collection of 5 ms or more
(`gc_pauses`): [generation, wall ms, objects collected, CPU ms, objects tracked after a
full collection (only with MESHROUTE_BENCH_GC_COUNT=1, else -1), uncollectable, 1 if the
loop's thread collected (else another thread: this hook's heartbeat, a `to_thread` worker;
it holds the GIL all the same), ms spent counting the tracked objects (after the timing, but
a stall of its own: 15-70 ms with 1,000 streams open, hence off by default)].
Nothing of the server is imported or changed; the cost is one wake-up of the loop per beat.

A census on request (a development aid, never during a measured phase): write a name into
OUT + ".census" and, within a second, the loop runs one full collection, timed, then counts
every tracked object by type and by where it comes from (the package of its type, its code
or its function, else of the nearest object that refers to it), and writes
OUT + ".census-NAME.json". `python benchmarks/bench_stream_objects.py` drives it.

As experiments only: MESHROUTE_BENCH_GC_THRESHOLD="g0,g1,g2" sets the GC thresholds;
MESHROUTE_BENCH_GC_FREEZE_AFTER_S=S calls gc.freeze() on the loop S seconds after it is made
(the start-up heap then leaves the collections); MESHROUTE_BENCH_GC_REFREEZE=1 calls
gc.freeze() after every full collection, so that the next one walks only what was promoted
since (what survives is never walked again: cyclic garbage among it would never be freed).
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import gc
import json
import os
import sys
import threading
import time
import types
from typing import Any

OUT = os.environ.get("MESHROUTE_BENCH_HOOK_OUT")
INTERVAL_S = float(os.environ.get("MESHROUTE_BENCH_HOOK_INTERVAL_S", "0.01"))
GC_REPORT_MS = 5.0
REFREEZE = os.environ.get("MESHROUTE_BENCH_GC_REFREEZE") == "1"
# Counting the tracked objects after a full collection (`len(gc.get_objects())`) took 15-70
# ms with 1,000 streams open, in the loop's thread: a stall the hook itself added to every
# full collection's. Off unless asked for; bench_stream_objects.py counts them instead.
COUNT_TRACKED = os.environ.get("MESHROUTE_BENCH_GC_COUNT") == "1"


class _Recorder:
    def __init__(self, path: str) -> None:
        self.path = path
        self.lags_ms: list[float] = []
        self.cpu_lags_ms: list[float] = []  # CPU time the loop's thread used during each lag
        # How late the heartbeat thread itself woke from each sleep: waiting for the GIL (a
        # collection in any thread holds it, and then no beat can even be posted, so the lag
        # above misses it) or for a core.
        self.beat_late_ms: list[float] = []
        self.gcs: list[list[float]] = []
        self.gc_total_ms = 0.0
        self.gc_total_cpu_ms = 0.0
        self._gc_began = self._gc_cpu_began = 0.0
        self._gen_stats = self._no_stats()
        self.loop_thread: int | None = None
        self.last_full: tuple[float, float] = (0.0, 0.0)  # the last full collection: wall, CPU
        self._lock = threading.Lock()

    @staticmethod
    def _no_stats() -> dict[str, list[float]]:
        return {"n": [0, 0, 0], "wall_ms_max": [0.0, 0.0, 0.0], "cpu_ms_max": [0.0, 0.0, 0.0],
                "uncollectable": [0, 0, 0]}

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        now, cpu = time.perf_counter(), time.thread_time()
        if phase == "start":
            self._gc_began, self._gc_cpu_began = now, cpu
            return
        gen = info["generation"]
        wall_ms, cpu_ms = (now - self._gc_began) * 1e3, (cpu - self._gc_cpu_began) * 1e3
        self.gc_total_ms += wall_ms
        self.gc_total_cpu_ms += cpu_ms
        stats = self._gen_stats
        stats["n"][gen] += 1
        stats["wall_ms_max"][gen] = max(stats["wall_ms_max"][gen], round(wall_ms, 2))
        stats["cpu_ms_max"][gen] = max(stats["cpu_ms_max"][gen], round(cpu_ms, 2))
        stats["uncollectable"][gen] += info["uncollectable"]
        if gen == 2:
            self.last_full = (wall_ms, cpu_ms)
            if REFREEZE:  # an experiment, off by default: see the module's docstring
                gc.freeze()
        if wall_ms >= GC_REPORT_MS or cpu_ms >= GC_REPORT_MS:
            tracked, count_ms = -1, 0.0
            if gen == 2 and COUNT_TRACKED:
                began = time.perf_counter()
                tracked = len(gc.get_objects())
                count_ms = (time.perf_counter() - began) * 1e3
            self.gcs.append([gen, round(wall_ms, 2), info["collected"], round(cpu_ms, 2),
                             tracked, info["uncollectable"],
                             int(threading.get_ident() == self.loop_thread),
                             round(count_ms, 2)])

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
            slept = time.perf_counter()
            time.sleep(INTERVAL_S)
            late_ms = (time.perf_counter() - slept - INTERVAL_S) * 1e3
            with self._lock:
                self.beat_late_ms.append(late_ms)
            if time.monotonic() - flushed >= 1.0:
                flushed = time.monotonic()
                self.flush()
                self._census_requested(loop)

    def _landed(self, posted: float, posted_cpu: float) -> None:
        lag_s, cpu_s = time.perf_counter() - posted, time.thread_time() - posted_cpu
        with self._lock:
            self.lags_ms.append(lag_s * 1e3)
            self.cpu_lags_ms.append(cpu_s * 1e3)

    def flush(self) -> None:
        with self._lock:
            lags, self.lags_ms = self.lags_ms, []
            cpu_lags, self.cpu_lags_ms = self.cpu_lags_ms, []
            late, self.beat_late_ms = self.beat_late_ms, []
        gcs, self.gcs = self.gcs, []
        stats, self._gen_stats = self._gen_stats, self._no_stats()
        lags.sort()
        line = {"t": round(time.time(), 3), "beats": len(lags),
                "lag_max_ms": round(lags[-1], 2) if lags else None,
                "lag_p99_ms": round(lags[int(0.99 * (len(lags) - 1))], 2) if lags else None,
                "over_50ms": sum(x > 50 for x in lags),
                "cpu_lag_max_ms": round(max(cpu_lags), 2) if cpu_lags else None,
                "cpu_over_50ms": sum(x > 50 for x in cpu_lags),
                "beat_late_max_ms": round(max(late), 2) if late else None,
                "beat_late_over_50ms": sum(x > 50 for x in late),
                "gc_total_ms": round(self.gc_total_ms, 1),
                "gc_total_cpu_ms": round(self.gc_total_cpu_ms, 1),
                "gc": stats, "gc_pauses": gcs}
        with open(self.path, "a") as out:
            out.write(json.dumps(line) + "\n")

    def _census_requested(self, loop: asyncio.AbstractEventLoop) -> None:
        request = self.path + ".census"
        try:
            with open(request) as f:
                name = f.read().strip() or "census"
            os.unlink(request)
        except OSError:
            return
        loop.call_soon_threadsafe(self._census, name)

    def _census(self, name: str) -> None:
        gc.collect()
        wall_ms, cpu_ms = self.last_full  # as timed by on_gc (without its own counting)
        out = census()
        out.update(name=name, full_collection_wall_ms=round(wall_ms, 2),
                   full_collection_cpu_ms=round(cpu_ms, 2), frozen=gc.get_freeze_count(),
                   threshold=gc.get_threshold())
        tmp = f"{self.path}.census-{name}.json.tmp"
        with open(tmp, "w") as f:
            json.dump(out, f)
        os.replace(tmp, f"{self.path}.census-{name}.json")


# -- census: tracked objects by type and by source ---------------------------------------------
SOURCES = (  # (path or module fragment, source), first match wins
    ("meshroute_middleware", "meshroute"), ("uvicorn", "uvicorn/httptools"),
    ("httptools", "uvicorn/httptools"), ("h11", "uvicorn/httptools"),
    ("starlette", "starlette"), ("aiohappyeyeballs", "aiohttp client"),
    ("aiohttp", "aiohttp client"), ("multidict", "aiohttp client"),
    ("yarl", "aiohttp client"), ("propcache", "aiohttp client"),
    ("frozenlist", "aiohttp client"), ("aiosignal", "aiohttp client"),
    ("uvloop", "asyncio/uvloop"), ("asyncio", "asyncio/uvloop"), ("anyio", "anyio"),
    ("_hooks", "bench hook"), ("sitecustomize", "bench hook"),
)
# Modules of generic containers: their objects take the source of whoever holds them.
_CONTAINERS = frozenset({"builtins", "collections", "_collections", "_contextvars",
                         "contextvars", "weakref", "_weakref", "_weakrefset", "functools",
                         "types"})


def _source_of(where: str | None) -> str | None:
    if not where:
        return None
    for fragment, source in SOURCES:
        if fragment in where:
            return source
    return "other"


def _code_of(obj: object) -> types.CodeType | None:
    if isinstance(obj, types.FrameType):
        return obj.f_code
    if isinstance(obj, types.CoroutineType):
        return obj.cr_code
    if isinstance(obj, types.GeneratorType):
        return obj.gi_code
    if isinstance(obj, types.AsyncGeneratorType):
        return obj.ag_code
    if isinstance(obj, types.FunctionType):
        return obj.__code__
    return None


def _own_source(obj: object) -> str | None:
    """Where an object comes from by itself: its type's module, or its code's file; None for
    the plain containers (dict, list, tuple, cell, ...), which take their owner's."""
    code = _code_of(obj)
    if code is not None:
        return _source_of(code.co_filename)
    if isinstance(obj, types.MethodType):
        return _own_source(obj.__func__)
    if isinstance(obj, asyncio.Task):  # the task of a coroutine: where the coroutine is
        return _own_source(obj.get_coro())
    module = type(obj).__module__
    if not isinstance(module, str) or module in _CONTAINERS:
        return None
    return _source_of(module)


def _type_name(obj: object) -> str:
    if isinstance(obj, types.MethodType):
        obj = obj.__func__
        name = "method"
    else:
        name = type(obj).__qualname__
    code = _code_of(obj)
    if code is not None:
        return f"{name} {code.co_qualname}"
    module = type(obj).__module__
    return name if module == "builtins" or not isinstance(module, str) else f"{module}.{name}"


def census() -> dict[str, Any]:
    """Every tracked object (outside the frozen start-up heap) by type and by source; an
    object without a source of its own gets that of the nearest referrer that has one."""
    objs = [o for o in gc.get_objects() if o is not sys._getframe()]
    own: dict[int, str | None] = {id(o): _own_source(o) for o in objs}
    owner: dict[int, object] = {}
    for o in sorted(objs, key=lambda x: own[id(x)] is None):  # owners with a source first
        for r in gc.get_referents(o):
            owner.setdefault(id(r), o)
    by_type: collections.Counter[str] = collections.Counter()
    by_source: collections.Counter[str] = collections.Counter()
    by_source_type: collections.Counter[str] = collections.Counter()
    for o in objs:
        source, at, hops = own[id(o)], o, 0
        while source is None and hops < 8:
            at = owner.get(id(at))
            if at is None:
                break
            source, hops = own.get(id(at)), hops + 1
        source = source or "unattributed"
        kind = _type_name(o)
        by_type[kind] += 1
        by_source[source] += 1
        by_source_type[f"{source} | {kind}"] += 1
    return {"tracked": len(objs), "by_source": dict(by_source), "by_type": dict(by_type),
            "by_source_type": dict(by_source_type)}


def _install(path: str) -> None:
    recorder = _Recorder(path)
    gc.callbacks.append(recorder.on_gc)
    atexit.register(recorder.flush)  # the last second's beats too

    def watched(factory: Any) -> Any:
        def make(*args: Any, **kwargs: Any) -> Any:
            loop = factory(*args, **kwargs)
            recorder.loop_thread = threading.get_ident()
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
