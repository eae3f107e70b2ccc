"""What the mitmproxy addon adds to a request's latency, against mitmproxy without it.

Three paths to the same instant chat backend (`benchmarks._apps:chat`, its own uvicorn process),
one client request at a time (httpx, keep-alive):
- `direct`: the backend itself;
- `mitmproxy`: through `mitmdump -s meshroute_middleware/app/mitm/addon.py`, for a model the mesh
  does not serve, so the addon lets the flow pass untouched (mitmproxy's own cost);
- `routed`: through the same mitmdump for the mesh's model: parsed, routed, opened by the
  addon, relayed over loopback, measured and recorded.
Requests run in ROUNDS rounds interleaved over the paths, so a burst of load from other
processes on this shared machine hits every path alike; a row is the median of its round
medians. JSON answers and SSE streams of 64 chunks.

Run inside the mitm venv:  "$(scripts/mitm-venv | tail -1)/bin/python" benchmarks/bench_mitm.py
Writes benchmarks/results/mitm.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
MITMDUMP = str(Path(PY).parent / "mitmdump")
ADDON = ROOT / "meshroute_middleware" / "mitm" / "addon.py"
URL = "http://mesh.invalid/v1/chat/completions"  # the addon routes it; never resolved


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(probe: Any, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            probe()
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not come up")


def one(client: httpx.Client, url: str, body: dict[str, Any]) -> float:
    began = time.perf_counter()
    with client.stream("POST", url, json=body) as resp:
        for _ in resp.iter_raw():
            pass
        assert resp.status_code == 200, resp.status_code
    return time.perf_counter() - began


def run(rounds: int, per_round: int, tmp: Path) -> dict[str, Any]:
    backend_port, proxy_port, side_port = free_port(), free_port(), free_port()
    backend = f"http://127.0.0.1:{backend_port}"
    nodes = tmp / "nodes.json"
    nodes.write_text(json.dumps([{"node_id": "n", "model": "m", "start": 0, "end": 39,
                                  "layers": 40, "url": backend, "tps": 50}]))
    procs = [
        subprocess.Popen([PY, "-m", "uvicorn", "benchmarks._apps:chat", "--host", "127.0.0.1",
                          "--port", str(backend_port), "--log-level", "warning",
                          "--no-access-log"], cwd=ROOT),
        subprocess.Popen([MITMDUMP, "-q", "-s", str(ADDON), "--listen-host", "127.0.0.1",
                          "--listen-port", str(proxy_port), "--set",
                          f"meshroute_nodes_file={nodes}", "--set",
                          f"meshroute_side_port={side_port}", "--set", "meshroute_mdns=false",
                          "--set", "meshroute_health_interval_s=600"], cwd=ROOT)]
    try:
        wait_for(lambda: httpx.get(backend + "/v1/models", timeout=1), "backend")
        wait_for(lambda: httpx.get(f"http://127.0.0.1:{side_port}/healthz", timeout=1).json(),
                 "mitmdump")
        proxy = f"http://127.0.0.1:{proxy_port}"
        paths = {"direct": (None, backend + "/v1/chat/completions", "m"),
                 "mitmproxy": (proxy, backend + "/v1/chat/completions", "other"),
                 "routed": (proxy, URL, "m")}
        clients = {name: httpx.Client(proxy=p, timeout=10) for name, (p, _, _) in paths.items()}
        results: dict[str, Any] = {}
        for stream in (False, True):
            medians: dict[str, list[float]] = {name: [] for name in paths}
            for _ in range(rounds):
                for name, (_, url, model) in paths.items():
                    body = {"model": model, "messages": [{"role": "user", "content": "hi"}],
                            "stream": stream, "max_tokens": 64}
                    one(clients[name], url, body)  # warm the connection
                    times = [one(clients[name], url, body) for _ in range(per_round)]
                    medians[name].append(statistics.median(times) * 1000)
            kind = "sse" if stream else "json"
            results[kind] = {name: {"p50_ms": statistics.median(m), "round_p50s_ms": m}
                             for name, m in medians.items()}
        table = httpx.get(f"http://127.0.0.1:{side_port}/v1/routing", timeout=5).json()
        row = table["models"]["m"]["candidates"][0]
        results["recorded"] = {"samples": row["samples"], "tps": row["tps"]}
        for c in clients.values():
            c.close()
        return results
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--per-round", type=int, default=40)
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/mitm.json"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        res = run(args.rounds, args.per_round, Path(tmp))
    print(f"{'answer':6} {'path':10} {'p50 ms':>8} {'vs direct':>10} {'vs mitmproxy':>13}")
    for kind in ("json", "sse"):
        rows = res[kind]
        for name, row in rows.items():
            print(f"{kind:6} {name:10} {row['p50_ms']:8.2f} "
                  f"{row['p50_ms'] / rows['direct']['p50_ms']:9.2f}x "
                  f"{row['p50_ms'] / rows['mitmproxy']['p50_ms']:12.2f}x")
        added = rows["routed"]["p50_ms"] - rows["mitmproxy"]["p50_ms"]
        print(f"{kind:6} the addon adds {added:.2f} ms p50 over mitmproxy alone")
    print(f"recorded by the router: {res['recorded']['samples']:.0f} samples")
    Path(args.json).write_text(json.dumps({"machine": platform.platform(),
                                           "cpus": os.cpu_count(),
                                           "rounds": args.rounds,
                                           "per_round": args.per_round, **res}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
