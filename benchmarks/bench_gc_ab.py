"""The gateway's garbage-collector pacing against CPython's own collector, interleaved.

  python benchmarks/bench_gc_ab.py [--rounds 8] [--seconds 3] [--connections 32] [--json PATH]

Two `meshroute serve` processes on 127.0.0.1 in front of one instant chat backend: the default
(`--gc paced`, app/gcpace.py) and `--gc python`. After a 1 s warm-up each, the rounds alternate
them (A B, B A, ...) with wrk; each row gives the median and the range of req/s and of the
server process's CPU time per request (from /proc). Needs `wrk` (Debian package).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_gateway import CHAT, PY, ROOT, _register, free_port, serve, wait_up, wrk

VARIANTS = {"paced": [], "python": ["--gc", "python"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--seconds", type=int, default=3)
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/gc_ab.json"))
    args = parser.parse_args()
    backend_port = free_port()
    backend = f"http://127.0.0.1:{backend_port}"
    procs = [serve("chat", backend_port)]
    urls: dict[str, tuple[str, int]] = {}
    for name, flags in VARIANTS.items():
        port = free_port()
        procs.append(subprocess.Popen(
            [PY, "-m", "meshroute_middleware.app.cli", "serve", "--port", str(port),
             "--no-mdns", "--log-level", "warning", *flags], cwd=ROOT))
        urls[name] = (f"http://127.0.0.1:{port}", procs[-1].pid)
    try:
        time.sleep(1.0)
        wait_up(backend)
        for url, _ in urls.values():
            _register(url, backend)
            wait_up(url)
            wrk(url, CHAT, args.connections, 1)
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in urls}
        for r in range(args.rounds):
            order = list(urls) if r % 2 == 0 else list(urls)[::-1]
            for name in order:
                print(f"\rround {r + 1}/{args.rounds}: {name:<8}", end="", file=sys.stderr,
                      flush=True)
                url, pid = urls[name]
                runs[name].append(wrk(url, CHAT, args.connections, args.seconds, pid))
        print(file=sys.stderr)
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)
    out = {name: {key: {"median": statistics.median(x[key] for x in rs),
                        "min": min(x[key] for x in rs), "max": max(x[key] for x in rs),
                        "rounds": [round(x[key], 1) for x in rs]}
                  for key in ("rps", "cpu_us")} for name, rs in runs.items()}
    print("\n| gc | req/s median (range) | CPU µs/request median (range) |\n|---|---:|---:|")
    for name, r in out.items():
        print(f"| {name} | {r['rps']['median']:,.0f} ({r['rps']['min']:,.0f}–"
              f"{r['rps']['max']:,.0f}) | {r['cpu_us']['median']:.0f} "
              f"({r['cpu_us']['min']:.0f}–{r['cpu_us']['max']:.0f}) |")
    ratio = out["python"]["cpu_us"]["median"] / out["paced"]["cpu_us"]["median"]
    print(f"CPU per request, python / paced: {ratio:.3f}")
    Path(args.json).write_text(json.dumps({"variants": out, "cpu_python_over_paced": ratio,
                                           "args": vars(args)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
