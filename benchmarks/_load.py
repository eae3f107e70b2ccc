"""Load of the load benchmarks: wrk runs, an SSE stream holder, the stall probe, the hook's log.

Every loop is bounded in time; everything talks to 127.0.0.1. Processes and /proc: _procs.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks._procs import PY, cpu_seconds


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100, nearest rank) of `values`; nan when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


# -- wrk (non-streaming load) -----------------------------------------------------------------
WRK_DONE = """
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('WRKJSON {"requests":%d,"duration_us":%d,"p50_us":%d,"p95_us":%d,'
    .. '"p99_us":%d,"max_us":%d,"connect":%d,"read":%d,"write":%d,"status":%d,"timeout":%d}\\n',
    summary.requests, summary.duration, latency:percentile(50), latency:percentile(95),
    latency:percentile(99), latency.max, e.connect, e.read, e.write, e.status, e.timeout))
end
"""


def wrk_script(body: str, headers: dict[str, str]) -> str:
    """A wrk Lua script that POSTs `body` and prints its summary as one JSON line."""
    lines = ['wrk.method = "POST"', f"wrk.body = {json.dumps(body)}"]
    lines += [f"wrk.headers[{json.dumps(k)}] = {json.dumps(v)}" for k, v in headers.items()]
    return "\n".join(lines) + "\n" + WRK_DONE


async def wrk(url: str, body: str, connections: int, seconds: float,
              headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> dict[str, float]:
    """Run `wrk -t1` POSTing `body` to `url`; req/s, latency percentiles (ms), errors."""
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(wrk_script(body, hdrs))
    try:
        proc = await asyncio.create_subprocess_exec(
            "wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s",
            f"--timeout={int(timeout_s)}s", "-s", script.name, url,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
    finally:
        os.unlink(script.name)
    line = next((x for x in out.decode().splitlines() if x.startswith("WRKJSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk failed on {url}: {out.decode()} {err.decode()}")
    raw = json.loads(line.removeprefix("WRKJSON "))
    seconds_run = raw["duration_us"] / 1e6
    errors = raw["connect"] + raw["read"] + raw["write"] + raw["status"] + raw["timeout"]
    return {"requests": raw["requests"], "rps": raw["requests"] / seconds_run,
            "p50_ms": raw["p50_us"] / 1e3, "p95_ms": raw["p95_us"] / 1e3,
            "p99_ms": raw["p99_us"] / 1e3, "max_ms": raw["max_us"] / 1e3,
            "errors": errors, "non2xx": raw["status"], "timeouts": raw["timeout"],
            "seconds": seconds_run}


# -- SSE streams (an asyncio client holding many open streams) --------------------------------
@dataclass
class StreamStats:
    """What the stream holder saw in one phase."""

    started: int = 0
    ok: int = 0
    failed: int = 0
    open_now: int = 0
    peak_open: int = 0
    chunks: int = 0
    ttft_ms: list[float] = field(default_factory=list)
    max_gap_ms: list[float] = field(default_factory=list)  # per stream: longest chunk gap
    errors: dict[str, int] = field(default_factory=dict)

    def summary(self, seconds: float) -> dict[str, Any]:
        return {"streams_started": self.started, "streams_ok": self.ok,
                "streams_failed": self.failed, "peak_open_streams": self.peak_open,
                "chunks": self.chunks, "chunks_per_s": self.chunks / seconds,
                "ttft_p50_ms": pct(self.ttft_ms, 50), "ttft_p95_ms": pct(self.ttft_ms, 95),
                "ttft_p99_ms": pct(self.ttft_ms, 99),
                "chunk_gap_max_p50_ms": pct(self.max_gap_ms, 50),
                "chunk_gap_max_p99_ms": pct(self.max_gap_ms, 99),
                "chunk_gap_max_ms": max(self.max_gap_ms, default=float("nan")),
                "errors": dict(self.errors)}


async def _one_stream(session: aiohttp.ClientSession, url: str, body: bytes,
                      headers: dict[str, str], stats: StreamStats) -> None:
    stats.started += 1
    began = time.perf_counter()
    first = last = None
    max_gap, done, held = 0.0, False, False
    try:
        async with session.post(url, data=body, headers=headers) as resp:
            if resp.status != 200:
                raise RuntimeError(f"status {resp.status}: {_error_text(await resp.read())}")
            stats.open_now += 1
            held = True
            stats.peak_open = max(stats.peak_open, stats.open_now)
            async for line in resp.content:
                if not line.startswith(b"data: "):
                    continue
                now = time.perf_counter()
                if line.startswith(b"data: [DONE]"):
                    done = True
                    break
                if b'"error"' in line[:20]:
                    raise RuntimeError("SSE error event")
                stats.chunks += 1
                if first is None:
                    first = now
                    stats.ttft_ms.append((now - began) * 1e3)
                else:
                    assert last is not None
                    max_gap = max(max_gap, now - last)
                last = now
        if not done:
            raise RuntimeError("stream ended without [DONE]")
        stats.ok += 1
        stats.max_gap_ms.append(max_gap * 1e3)
    except (TimeoutError, aiohttp.ClientError, RuntimeError) as exc:
        stats.failed += 1
        key = f"{type(exc).__name__}: {str(exc)[:240]}"
        stats.errors[key] = stats.errors.get(key, 0) + 1
    finally:
        if held:
            stats.open_now -= 1


def _error_text(body: bytes) -> str:
    """An error answer in short: its message and, for meshroute, each route's reason."""
    try:
        error = json.loads(body)["error"]
        routes = error.get("routes") or {}
        reasons = [str(r)[:200] for r in (routes.values() if isinstance(routes, dict) else routes)]
        return f"{str(error.get('message'))[:80]} {reasons}".strip()
    except (ValueError, KeyError, TypeError, AttributeError):
        return body[:120].decode(errors="replace")


async def hold_streams(url: str, body: dict[str, Any], streams: int, seconds: float,
                       ramp_s: float, headers: dict[str, str] | None = None,
                       stream_timeout_s: float = 120.0) -> dict[str, Any]:
    """Keep `streams` SSE requests open for `seconds`: each of `streams` workers (started
    over `ramp_s`) opens a stream, reads it to [DONE], and opens the next until time is up
    (each opens one at least).
    Returns the StreamStats summary (TTFT measured from sending to the first data chunk)."""
    stats = StreamStats()
    data = json.dumps(body).encode()
    hdrs = {"content-type": "application/json", **(headers or {})}
    end = time.monotonic() + seconds
    timeout = aiohttp.ClientTimeout(total=stream_timeout_s)
    connector = aiohttp.TCPConnector(limit=0, force_close=True)

    async def worker(delay: float) -> None:
        await asyncio.sleep(delay)
        while True:  # at least one stream per worker, even one a loaded machine starts late
            await _one_stream(session, url, data, hdrs, stats)
            if time.monotonic() >= end:
                return

    began = time.monotonic()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await asyncio.gather(*(worker(ramp_s * i / streams) for i in range(streams)))
    return stats.summary(time.monotonic() - began)


# -- the stall probe --------------------------------------------------------------------------
class Probe:
    """A separate tiny blocking process that GETs a cheap endpoint every `interval_s` over a
    keep-alive connection and logs each answer's latency. A gateway whose event loop is
    blocked for X ms cannot answer for X ms, so the longest probe latency is an upper bound
    on the longest stall (it also holds queueing behind the loop's ordinary work and the
    probe's own scheduling delay, logged separately as `late`)."""

    def __init__(self, url: str, path: str, interval_s: float = 0.01,
                 cpus: set[int] | None = None) -> None:
        self.cpus = cpus  # run on these CPUs only (--pin: the gateway's)
        host_port = url.removeprefix("http://")
        self.host, self.port = host_port.split(":")[0], int(host_port.split(":")[1])
        self.path, self.interval_s = path, interval_s
        self.file = Path(tempfile.mkstemp(prefix="probe-", suffix=".log")[1])
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Probe:
        script = str(Path(__file__).with_name("_probe.py"))
        pin = ["taskset", "-c", ",".join(map(str, sorted(self.cpus)))] if self.cpus else []
        self.proc = subprocess.Popen([*pin, PY, script, self.host, str(self.port), self.path,
                                      str(self.interval_s), str(self.file)])
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(10)

    def window(self, t0: float, t1: float) -> dict[str, float]:
        """Probe latency stats (ms) between wall-clock times t0 and t1."""
        lat, late, bad = [], [], 0
        for line in self.file.read_text().splitlines():
            parts = line.split()
            if len(parts) != 4 or not t0 <= float(parts[0]) <= t1:
                continue
            lat.append(float(parts[1]))
            late.append(float(parts[2]))
            bad += parts[3] != "200"
        return {"probes": len(lat), "probe_p50_ms": pct(lat, 50), "probe_p99_ms": pct(lat, 99),
                "probe_max_ms": max(lat, default=float("nan")),
                "probes_over_50ms": sum(x > 50 for x in lat), "probe_failed": bad,
                "probe_self_late_max_ms": max(late, default=float("nan"))}


async def measure(coro: Any, pid: int | None = None, probe: Probe | None = None,
                  hook_out: Path | None = None) -> dict[str, Any]:
    """Await one load phase; add its wall-clock window, the CPU seconds `pid` (and its
    children) spent over it, the probe's stats and the loop-lag hook's over it."""
    cpu0 = cpu_seconds(pid) if pid else 0.0
    t0 = time.time()
    result = dict(await coro)
    t1 = time.time()
    result["window"] = (t0, t1)
    if pid:
        result["server_cpu_s"] = cpu_seconds(pid) - cpu0
    if probe is not None:
        result.update(probe.window(t0, t1))
    if hook_out is not None:
        await asyncio.sleep(1.1)  # the hook writes once a second
        result.update(hook_window(hook_out, t0, t1))
    return result


def hook_window(path: Path | None, t0: float, t1: float) -> dict[str, Any]:
    """The loop-lag hook's lines between t0 and t1: longest lag, beats over 50 ms, GC."""
    if path is None or not path.exists():
        return {}
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    lines = [x for x in lines if t0 < x["t"] <= t1 + 1.0]
    if not lines:
        return {}
    pauses = [p for x in lines for p in x["gc_pauses"]]
    gens: dict[str, list[float]] = {"n": [0, 0, 0], "wall_ms_max": [0.0, 0.0, 0.0],
                                    "cpu_ms_max": [0.0, 0.0, 0.0], "uncollectable": [0, 0, 0]}
    for x in lines:
        for key, values in (x.get("gc") or {}).items():
            for g, v in enumerate(values):
                gens[key][g] = (gens[key][g] + v if key in ("n", "uncollectable")
                                else max(gens[key][g], v))
    return {"loop_lag_max_ms": max((x["lag_max_ms"] or 0.0) for x in lines),
            "loop_beats": sum(x["beats"] for x in lines),
            "loop_lags_over_50ms": sum(x["over_50ms"] for x in lines),
            "loop_cpu_lag_max_ms": max((x.get("cpu_lag_max_ms") or 0.0) for x in lines),
            "loop_cpu_lags_over_50ms": sum(x.get("cpu_over_50ms", 0) for x in lines),
            # the heartbeat thread's own lateness: a stall holding the GIL (a collection)
            # that the lag misses, or the machine's load
            "heartbeat_late_max_ms": max((x.get("beat_late_max_ms") or 0.0) for x in lines),
            "heartbeat_late_over_50ms": sum(x.get("beat_late_over_50ms", 0) for x in lines),
            # busy lags over 50 ms in a second (or the one before) with a GC pause of 40+ ms
            # of CPU: how many stalls garbage collection explains
            "loop_cpu_lags_over_50ms_beside_gc": sum(
                x.get("cpu_over_50ms", 0) for i, x in enumerate(lines)
                if any(p[3] >= 40 for y in lines[max(0, i - 1):i + 1] for p in y["gc_pauses"])),
            "gc_ms": lines[-1]["gc_total_ms"] - lines[0]["gc_total_ms"],
            "gc_cpu_ms": (lines[-1].get("gc_total_cpu_ms", 0.0)
                          - lines[0].get("gc_total_cpu_ms", 0.0)),
            # wall clock (the stall as the loop lives it) and the collecting thread's CPU
            # time (the collector's own work; the gap is time spent waiting for a core)
            "gc_pause_max_ms": max((p[1] for p in pauses), default=0.0),
            "gc_pause_cpu_max_ms": max((p[3] for p in pauses), default=0.0),
            "gc_pauses_over_5ms": len(pauses),
            "gc_pauses_over_50ms": sum(p[1] > 50 for p in pauses),
            "gc_by_generation": gens,
            # collections of 20+ ms (wall or CPU) of any generation, and which thread ran
            # them: one in another thread (the hook's heartbeat, a to_thread worker) holds
            # the GIL as long, but the heartbeat cannot time it when it is that thread
            "gc_long_pauses": [{"generation": p[0], "wall_ms": p[1], "cpu_ms": p[3],
                                **({"loop_thread": bool(p[6])} if len(p) > 6 else {})}
                               for p in pauses if max(p[1], p[3]) >= 20][:100],
            "gc_gen2_pauses": [{"wall_ms": p[1], "cpu_ms": p[3], "collected": p[2],
                                "tracked_after": p[4],
                                **({"uncollectable": p[5], "loop_thread": bool(p[6]),
                                    "count_ms": p[7]} if len(p) > 7 else {})}
                               for p in pauses if p[0] == 2][:50]}


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per key, the median of the numeric values over the runs (others: the last run's)."""
    out: dict[str, Any] = {}
    for key, value in runs[-1].items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[key] = statistics.median(r[key] for r in runs)
        else:
            out[key] = value
    return out
