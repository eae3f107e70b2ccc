"""Gateway and middleware overhead, as ratios measured in one run (wrk as the load generator).

  python benchmarks/bench_gateway.py [--seconds 5] [--rounds 3] [--json PATH]

Every server is one uvicorn worker in its own process on 127.0.0.1; wrk runs with one thread.
A 1 s warm-up of every case comes first and is not recorded. Rounds interleave the variants
(A B C A B C ...) so a noisy neighbour hurts all alike; the median of the rounds is reported,
in req/s and in the server process's CPU time per request (from /proc).
Needs `wrk` (Debian package).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
CHAT = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
STREAM = json.dumps({"model": "m", "stream": True, "max_tokens": 64,
                     "messages": [{"role": "user", "content": "hi"}]})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve(target: str, port: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """uvicorn `benchmarks._apps:target` on a loopback port."""
    cmd = [PY, "-m", "uvicorn", f"benchmarks._apps:{target}", "--host", "127.0.0.1",
           "--port", str(port), "--log-level", "warning", "--no-access-log"]
    if target.startswith("wrapped"):
        cmd.append("--factory")
    return subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **(env or {})})


def wait_up(url: str) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.post(url + "/v1/chat/completions", content=CHAT, timeout=1)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used (Linux /proc), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wrk(url: str, body: str, connections: int, seconds: float,
        pid: int | None = None) -> dict[str, float]:
    """Requests/s and p50 latency (ms) of a POST load; with `pid`, also the CPU time that
    server process spent per request (µs): steadier than req/s on shared cores, because a
    neighbour that steals the CPU slows the server down without adding to its CPU time."""
    cpu0 = cpu_seconds(pid) if pid else 0.0
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as script:
        script.write(f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\n'
                     'wrk.headers["Content-Type"] = "application/json"\n')
    out = subprocess.run(
        ["wrk", "-t1", f"-c{connections}", f"-d{int(seconds)}s", "--latency", "-s", script.name,
         url + "/v1/chat/completions"], capture_output=True, text=True, check=True).stdout
    os.unlink(script.name)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
    scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}
    lat = float(p50.group(1)) * scale[p50.group(2)] if p50 else float("nan")
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if errors:
        raise RuntimeError(f"{url}: {errors.group(1)} failed responses:\n{out}")
    result = {"rps": rps, "p50_ms": lat}
    if pid:
        done = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
        result["cpu_us"] = (cpu_seconds(pid) - cpu0) / max(done, 1) * 1e6
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/gateway.json"))
    args = parser.parse_args()
    if not shutil.which("wrk"):
        print("wrk is needed: apt-get install -y wrk", file=sys.stderr)
        return 2
    names = ("backend", "bare", "wrapped", "bare_cpu", "wrapped_cpu", "passthrough",
             "measuring", "slow", "passthrough_slow", "gw", "gw_slow", "gw_gc_python")
    ports = {name: free_port() for name in names}
    url = {name: f"http://127.0.0.1:{p}" for name, p in ports.items()}
    procs = [serve("chat", ports["backend"]), serve("chat", ports["bare"]),
             serve("wrapped", ports["wrapped"]), serve("chat_cpu", ports["bare_cpu"]),
             serve("wrapped_cpu", ports["wrapped_cpu"]),
             serve("passthrough", ports["passthrough"], {"BACKEND_URL": url["backend"]}),
             serve("measuring_passthrough", ports["measuring"],
                   {"BACKEND_URL": url["backend"]}),
             serve("chat_slow", ports["slow"]),
             serve("passthrough", ports["passthrough_slow"], {"BACKEND_URL": url["slow"]}),
             *(subprocess.Popen([PY, "-m", "meshroute_middleware.app.cli", "serve", "--port",
                                 str(ports[gw]), "--no-mdns", "--log-level", "warning", *flags],
                                cwd=ROOT)
               for gw, flags in (("gw", ()), ("gw_slow", ()),
                                 ("gw_gc_python", ("--gc", "python"))))]
    try:
        time.sleep(1.0)
        for name in names[:-3]:
            wait_up(url[name])
        _register(url["gw"], url["backend"])
        _register(url["gw_slow"], url["slow"])
        _register(url["gw_gc_python"], url["backend"])
        for name in names[-3:]:
            wait_up(url[name])
        pids = dict(zip(names, (p.pid for p in procs), strict=True))  # started in this order
        results = _measure(url, pids, args.seconds, args.rounds)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    _report(results, args)
    return 0


def _register(gw: str, backend: str) -> None:
    deadline = time.monotonic() + 20
    while True:
        try:
            httpx.post(gw + "/v1/nodes", json={"node_id": "backend", "model": "m", "start": 0,
                                              "end": 39, "layers": 40, "url": backend})
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


CASES = [  # (name, server, body, connections)
    ("bare app, c=32", "bare", CHAT, 32), ("middleware, c=32", "wrapped", CHAT, 32),
    ("bare 1 ms app, c=32", "bare_cpu", CHAT, 32),
    ("middleware, 1 ms app, c=32", "wrapped_cpu", CHAT, 32),
    ("direct backend, c=32", "backend", CHAT, 32),
    ("pass-through, c=32", "passthrough", CHAT, 32),
    ("measuring pass-through, c=32", "measuring", CHAT, 32), ("gateway, c=32", "gw", CHAT, 32),
    # the gateway's garbage collector: paced (the default, app/gcpace.py) against CPython's
    # own, each right after its paced twin so that both see the same moment of the machine
    ("gateway --gc python, c=32", "gw_gc_python", CHAT, 32),
    ("direct backend, c=1", "backend", CHAT, 1),
    ("pass-through, c=1", "passthrough", CHAT, 1),
    ("measuring pass-through, c=1", "measuring", CHAT, 1), ("gateway, c=1", "gw", CHAT, 1),
    ("20 ms head direct, c=32", "slow", CHAT, 32),
    ("20 ms head pass-through, c=32", "passthrough_slow", CHAT, 32),
    ("20 ms head gateway, c=32", "gw_slow", CHAT, 32),
    ("SSE direct, c=8", "backend", STREAM, 8), ("SSE pass-through, c=8", "passthrough", STREAM, 8),
    ("SSE gateway, c=8", "gw", STREAM, 8),
    ("SSE gateway --gc python, c=8", "gw_gc_python", STREAM, 8),
]


def _measure(url: dict[str, str], pids: dict[str, int], seconds: float,
             rounds: int) -> dict[str, dict[str, float]]:
    samples: dict[str, list[dict[str, float]]] = {name: [] for name, *_ in CASES}
    for i, (name, server, body, conns) in enumerate(CASES):  # warm-up, not recorded: pools,
        print(f"\rwarm-up  case {i + 1}/{len(CASES)}: {name:<28}",  # caches, first enumeration
              end="", file=sys.stderr, flush=True)
        wrk(url[server], body, conns, 1)
    for r in range(rounds):
        for i, (name, server, body, conns) in enumerate(CASES):
            print(f"\rround {r + 1}/{rounds}  case {i + 1}/{len(CASES)}: {name:<28}",
                  end="", file=sys.stderr, flush=True)
            samples[name].append(wrk(url[server], body, conns, seconds, pids[server]))
    print(file=sys.stderr)
    return {name: {key: statistics.median(s[key] for s in runs)
                   for key in ("rps", "p50_ms", "cpu_us")}
            for name, runs in samples.items()}


def _report(res: dict[str, dict[str, float]], args: argparse.Namespace) -> None:
    def ratio(a: str, b: str) -> float:
        return res[a]["rps"] / res[b]["rps"]

    def cpu_ratio(a: str, b: str) -> float:  # throughput if CPU-bound: b's CPU / a's CPU
        return res[b]["cpu_us"] / res[a]["cpu_us"]

    ratios = {
        "middleware / bare app, instant app (c=32)": ratio("middleware, c=32",
                                                           "bare app, c=32"),
        "middleware / bare app, 1 ms app (c=32)": ratio("middleware, 1 ms app, c=32",
                                                         "bare 1 ms app, c=32"),
        "gateway / pass-through (c=32)": ratio("gateway, c=32", "pass-through, c=32"),
        "gateway / pass-through (c=1)": ratio("gateway, c=1", "pass-through, c=1"),
        "measuring pass-through / pass-through (c=32)": ratio("measuring pass-through, c=32",
                                                              "pass-through, c=32"),
        "gateway / measuring pass-through (c=32)": ratio("gateway, c=32",
                                                         "measuring pass-through, c=32"),
        "gateway / measuring pass-through (c=1)": ratio("gateway, c=1",
                                                        "measuring pass-through, c=1"),
        "gateway / direct (c=32)": ratio("gateway, c=32", "direct backend, c=32"),
        "gateway / pass-through, 20 ms head (c=32)": ratio("20 ms head gateway, c=32",
                                                            "20 ms head pass-through, c=32"),
        "SSE chunks/s gateway / direct (c=8)": ratio("SSE gateway, c=8", "SSE direct, c=8"),
        "SSE chunks/s gateway / pass-through (c=8)": ratio("SSE gateway, c=8",
                                                            "SSE pass-through, c=8"),
        "gateway, gc paced / --gc python (c=32)": ratio("gateway, c=32",
                                                        "gateway --gc python, c=32"),
        "SSE chunks/s gateway, gc paced / --gc python (c=8)": ratio(
            "SSE gateway, c=8", "SSE gateway --gc python, c=8"),
    }
    cpu_ratios = {
        "middleware / bare app, instant app (c=32)": cpu_ratio("middleware, c=32",
                                                               "bare app, c=32"),
        "middleware / bare app, 1 ms app (c=32)": cpu_ratio("middleware, 1 ms app, c=32",
                                                             "bare 1 ms app, c=32"),
        "gateway / pass-through (c=32)": cpu_ratio("gateway, c=32", "pass-through, c=32"),
        "measuring pass-through / pass-through (c=32)": cpu_ratio(
            "measuring pass-through, c=32", "pass-through, c=32"),
        "gateway / measuring pass-through (c=32)": cpu_ratio("gateway, c=32",
                                                             "measuring pass-through, c=32"),
        "gateway, gc paced / --gc python (c=32)": cpu_ratio("gateway, c=32",
                                                            "gateway --gc python, c=32"),
    }
    added = res["gateway, c=1"]["p50_ms"] - res["direct backend, c=1"]["p50_ms"]
    per_request_us = (1 / res["middleware, c=32"]["rps"] - 1 / res["bare app, c=32"]["rps"]) * 1e6
    gateway_us = (1 / res["gateway, c=32"]["rps"] - 1 / res["pass-through, c=32"]["rps"]) * 1e6
    print("\n| case | req/s | p50 ms | server CPU µs/request |\n|---|---:|---:|---:|")
    for name, r in res.items():
        print(f"| {name} | {r['rps']:,.0f} | {r['p50_ms']:.2f} | {r['cpu_us']:.0f} |")
    print("\n| ratio | value |\n|---|---:|")
    for name, value in ratios.items():
        print(f"| {name} | {value:.3f} |")
    print(f"| added p50 latency of the gateway vs direct (c=1) | {added:.2f} ms |")
    print(f"| middleware cost per request (instant app, c=32) | {per_request_us:.0f} µs |")
    print(f"| gateway cost per request over the pass-through (c=32) | {gateway_us:.0f} µs |")
    print("\n| the same ratios from server CPU per request | value |\n|---|---:|")
    for name, value in cpu_ratios.items():
        print(f"| {name} | {value:.3f} |")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({"cases": res, "ratios": ratios,
                                           "cpu_ratios": cpu_ratios,
                                           "added_p50_ms_c1": added,
                                           "middleware_us_per_request": per_request_us,
                                           "gateway_us_per_request": gateway_us,
                                           "seconds": args.seconds, "rounds": args.rounds},
                                          indent=2))


if __name__ == "__main__":
    sys.exit(main())
