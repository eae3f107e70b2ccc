"""Before/after of bench_overhead.py on a shared, busy machine:

  python benchmarks/bench_overhead_ab.py BEFORE_DIR AFTER_DIR [--pairs 4] [--rounds 30]

BEFORE_DIR and AFTER_DIR are two checkouts (e.g. `git archive REV | tar -x -C DIR`). For each
pair the two trees' variants run at the same time, one process each, so they share whatever
else the machine is doing; each times the CPU time of its own process (`time.process_time`)
and keeps the least disturbed (minimum) round of `--requests` requests per variant.
Wall-time medians (bench_overhead.py itself) are the number to quote on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

VARIANTS = ("bare app", "middleware (annotate)", "pass-through", "gateway (forward)")


async def _one_tree(requests: int, rounds: int) -> dict[str, float]:
    """Runs inside a child whose sys.path starts with the tree under test."""
    from dataclasses import replace

    import benchmarks.bench_overhead as b
    from benchmarks._apps import chat, wrapped

    forwarder = b.ASGIForwarder({b.HEAD: chat})
    gateway = b.build_gateway(replace(b.ServeSettings(), mdns=False, seed=1),
                              forwarder=forwarder)
    gateway.mesh.upsert(b.parse_node({"node_id": "b", "model": "m", "start": 0, "end": 39,
                                      "layers": 40, "url": b.HEAD}))
    apps: dict[str, Any] = dict(zip(VARIANTS, (chat, wrapped(), b.PassThrough(forwarder),
                                               gateway.app), strict=True))
    b.time = type("CPUTime", (), {"perf_counter": staticmethod(time.process_time)})
    for app in apps.values():
        await b.per_request_us(app, 500)
    best = dict.fromkeys(apps, float("inf"))
    for _ in range(rounds):
        for name, app in apps.items():
            best[name] = min(best[name], await b.per_request_us(app, requests))
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # argv: before = the tree, after = the JSON file to write
        sys.path.insert(0, args.before)
        best = asyncio.run(_one_tree(args.requests, args.rounds))
        Path(args.after).write_text(json.dumps(best))
        return 0
    results: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    for pair in range(args.pairs):
        procs = {}
        for side in ("before", "after"):
            tree = str(Path(getattr(args, side)).resolve())
            out = Path(f"/tmp/bench_overhead_ab.{side}.{pair}.json")
            procs[side] = (out, subprocess.Popen(
                [sys.executable, __file__, tree, str(out), "--child", "--rounds",
                 str(args.rounds), "--requests", str(args.requests)], cwd=tree))
        for side, (out, proc) in procs.items():
            if proc.wait() != 0:
                print(f"{side} failed", file=sys.stderr)
                return 1
            results[side].append(json.loads(out.read_text()))
        print(f"pair {pair + 1}/{args.pairs} done", file=sys.stderr)
    print("| µs of CPU per request (min of rounds) | before | after | after/before, per pair |")
    print("|---|---:|---:|---|")
    for name in VARIANTS:
        before = [r[name] for r in results["before"]]
        after = [r[name] for r in results["after"]]
        ratios = ", ".join(f"{a / b:.2f}" for b, a in zip(before, after, strict=True))
        print(f"| {name} (median of pairs) | {statistics.median(before):.1f} | "
              f"{statistics.median(after):.1f} | {ratios} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
