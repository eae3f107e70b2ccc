"""Scale-out on one machine: `meshroute serve --workers N`, throughput against N, and how fast
a sample learned in one worker reaches the others.

  python benchmarks/bench_workers.py [--workers 1,2,4] [--seconds 4] [--rounds 3]
                                     [--trials 10] [--json PATH]

Every gateway serves one port with N processes (SO_REUSEPORT) in front of one backend
process; wrk (one thread, 64 connections, spread by the kernel over the workers) loads each
in turn, rounds interleaved over N. Two backends: an instant one (the gateway is the
bottleneck) and one answering after 20 ms of waiting. CPU per request sums every worker.
Propagation: a chat request is recorded by whichever worker takes it; then new connections
(each lands on some worker) read /healthz (which worker) and /v1/routing (its sample count)
until every worker counts the sample; the time from the answer to the last worker's count.
Needs `wrk` (Debian package).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_gateway import (
    CHAT,
    PY,
    ROOT,
    cpu_seconds,
    free_port,
    serve,
    wrk,
)


def load(url: str, connections: int, seconds: float) -> dict[str, float]:
    """wrk's req/s and p50; non-2xx answers are counted (and reported), not fatal here."""
    try:
        return {**wrk(url, CHAT, connections, seconds), "errors": 0.0}
    except RuntimeError as exc:  # wrk saw failed responses: keep the figures, count them
        out = str(exc)
        rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
        p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
        scale = {"us": 0.001, "ms": 1.0, "s": 1000.0}
        errors = float(re.search(r"Non-2xx or 3xx responses: (\d+)", out).group(1))  # type: ignore[union-attr]
        return {"rps": rps, "p50_ms": float(p50.group(1)) * scale[p50.group(2)] if p50
                else float("nan"), "errors": errors}


def descendants(pid: int) -> list[int]:
    """The process and all its descendants (Linux /proc)."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def gateway(n: int, backend: str, interval: float, tmp: Path) -> tuple[subprocess.Popen[bytes],
                                                                          str]:
    nodes = tmp / f"nodes-{n}-{backend.rsplit(':', 1)[1]}.json"
    nodes.write_text(json.dumps([{"node_id": "b", "model": "m", "start": 0, "end": 9,
                                  "layers": 10, "url": backend, "tps": 10.0}]))
    port = free_port()
    proc = subprocess.Popen([PY, "-m", "meshroute_middleware.app.cli", "serve", "--workers",
                             str(n), "--port", str(port), "--no-mdns", "--nodes-file", str(nodes),
                             "--gossip-interval", str(interval), "--health-interval", "3600",
                             "--log-level", "warning"], cwd=ROOT)
    return proc, f"http://127.0.0.1:{port}"


def up(url: str, n: int) -> None:
    """Wait until all n workers answer a chat request."""
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    while len(seen) < n:
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url}: only workers {seen} came up")
        try:
            with httpx.Client(base_url=url, timeout=5) as client:
                seen.add(client.get("/healthz").json()["tracker"])
                client.post("/v1/chat/completions", content=CHAT,
                            headers={"content-type": "application/json"})
        except httpx.HTTPError:
            time.sleep(0.1)


def worker_view(client: httpx.Client) -> tuple[str, int]:
    """Which worker holds this keep-alive connection, and how many samples it counts."""
    tracker = client.get("/healthz").json()["tracker"]
    rows = client.get("/v1/routing").json()["models"]["m"]["candidates"]
    return tracker, sum(r["samples"] for r in rows)


def one_connection_per_worker(url: str, n: int) -> list[httpx.Client]:
    """Keep-alive clients, one on each worker (the kernel picks a worker per connection)."""
    held: dict[str, httpx.Client] = {}
    for _ in range(200 * n):
        client = httpx.Client(base_url=url, timeout=5)
        tracker = client.get("/healthz").json()["tracker"]
        if tracker in held:
            client.close()
        else:
            held[tracker] = client
        if len(held) == n:
            return list(held.values())
    raise RuntimeError(f"{url}: reached only {sorted(held)}")


def propagation(url: str, n: int, trials: int) -> list[float]:
    """Seconds from a recorded answer until all n workers count it, per trial; each worker is
    polled on a connection of its own, so the poll adds one round trip, not a search. Each
    trial starts once every worker agrees on the count."""
    times = []
    for _ in range(trials):
        clients = one_connection_per_worker(url, n)
        try:
            settled = time.monotonic() + 30
            while True:  # every worker reached, all agreeing on the count
                views = dict(worker_view(c) for c in clients)
                if len(views) == n and len(set(views.values())) == 1:
                    break
                if len(views) < n:  # an idle connection was closed and reopened elsewhere
                    clients.append(httpx.Client(base_url=url, timeout=5))
                if time.monotonic() > settled:
                    raise RuntimeError(f"the workers never agreed on a count: {views}")
            total = worker_view(clients[0])[1]
            resp = clients[0].post("/v1/chat/completions", content=CHAT,
                                   headers={"content-type": "application/json"})
            resp.raise_for_status()
            done, have = time.monotonic(), {}
            while len(have) < n or min(have.values()) < total + 1:
                if time.monotonic() - done > 30:
                    raise RuntimeError(f"no propagation in 30 s: {have}")
                polled = set()
                for client in clients:
                    tracker, samples = worker_view(client)
                    have[tracker] = samples
                    polled.add(tracker)
                if len(polled) < n:  # an idle connection was closed and reopened elsewhere
                    clients.append(httpx.Client(base_url=url, timeout=5))
            times.append(time.monotonic() - done)
        finally:
            for client in clients:
                client.close()
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2,4")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--gossip-interval", type=float, default=1.0)
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/workers.json"))
    args = parser.parse_args()
    counts = [int(x) for x in args.workers.split(",")]
    ports = {"chat": free_port(), "chat_slow": free_port()}
    backends = {name: f"http://127.0.0.1:{p}" for name, p in ports.items()}
    procs = [serve(name, port) for name, port in ports.items()]
    gateways: dict[tuple[str, int], tuple[subprocess.Popen[bytes], str]] = {}
    results: dict[str, Any] = {"args": vars(args), "load": {}, "propagation": {}}
    results["meta"] = {"date": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                       "load_average_before": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            for name, backend in backends.items():
                for n in counts:
                    gateways[name, n] = gateway(n, backend, args.gossip_interval, Path(tmp))
            for (_, n), (_, url) in gateways.items():
                up(url, n)
            for n in counts:
                if n > 1:
                    times = propagation(gateways["chat", n][1], n, args.trials)
                    results["propagation"][f"N={n}"] = {
                        "median_s": statistics.median(times), "max_s": max(times),
                        "trials": times}
            for _, (_, url) in gateways.items():  # warm-up, not recorded
                load(url, args.connections, 1)
            runs: dict[str, list[dict[str, float]]] = {}
            for _ in range(args.rounds):
                for (name, n), (proc, url) in gateways.items():
                    pids = descendants(proc.pid)
                    cpu0 = sum(cpu_seconds(p) for p in pids)
                    started = time.monotonic()
                    got = load(url, args.connections, args.seconds)
                    got["cpu_us"] = ((sum(cpu_seconds(p) for p in pids) - cpu0)
                                     / max(got["rps"] * (time.monotonic() - started), 1) * 1e6)
                    runs.setdefault(f"{name} N={n}", []).append(got)
            for key, rows in runs.items():
                results["load"][key] = {
                    "rps": statistics.median(r["rps"] for r in rows),
                    "p50_ms": statistics.median(r["p50_ms"] for r in rows),
                    "cpu_us": statistics.median(r["cpu_us"] for r in rows),
                    "errors": sum(r["errors"] for r in rows),
                    "rounds": rows}
        finally:
            for proc, _ in gateways.values():
                proc.terminate()
            for p in procs:
                p.terminate()
            for proc in [*(g for g, _ in gateways.values()), *procs]:
                proc.wait(20)
    results["meta"]["load_average_after"] = os.getloadavg()
    Path(args.json).write_text(json.dumps(results, indent=2))
    print("| backend | workers | req/s | p50 ms | CPU µs/request (all workers) | non-2xx |")
    print("|---|---:|---:|---:|---:|---:|")
    for key, row in results["load"].items():
        name, n = key.split(" N=")
        print(f"| {'instant' if name == 'chat' else '20 ms head'} | {n} | {row['rps']:,.0f} "
              f"| {row['p50_ms']:.2f} | {row['cpu_us']:.0f} | {row['errors']:.0f} |")
    for key, row in results["propagation"].items():
        print(f"propagation {key}: median {row['median_s']:.2f} s, max {row['max_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
