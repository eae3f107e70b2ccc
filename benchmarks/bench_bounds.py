"""Bounds benchmark (issue 11, item 7): what idle subscribers, many models and big models cost.

- `publish`: one event published with S idle /v1/routing/events subscribers (clients that
  opened the stream and stopped reading), µs per event on the publisher's (request) path;
  `publish+fan-out`: the same plus one loop turn, so the fan-out is included wherever it runs.
  Before: one queue put per subscriber per event, on the request path. After: one append;
  the fan-out runs once per batch in a loop callback, and at most 64 subscribers stay open
  (opening more closes the oldest).
- `scrape`: one uncached `/metrics` computation (`Telemetry.render`) with M models of three
  heads each; `routing`: one `/v1/routing` table (`Router.routing_table`). After: both are
  served from a one-second cache, and the scrape reads merged views only (no Monte-Carlo).
- `decision after change`: the first `choose` after a node's load changed, with N nodes in
  one model (enumeration included). After: --max-nodes (1,024 by default) caps N.
Each figure is the median of repeated runs in this process.

Run:  python benchmarks/bench_bounds.py [--baseline REV]
`--baseline REV` runs the same measurements against meshroute_middleware as of git revision
REV (exported to a temporary directory) in a subprocess: before and after in one run.
Writes benchmarks/results/bounds.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from meshroute_middleware.core import NodeRecord, Router, RouterConfig
from meshroute_middleware.telemetry.events import EventBus
from meshroute_middleware.telemetry.metrics import Telemetry

RESULTS = Path(__file__).parent / "results" / "bounds.json"
SUBSCRIBERS = (0, 64, 5000)
MODELS = (341, 3000)  # 341 x 3 heads = 1,023 nodes: the most the default --max-nodes allows
BIG_MODEL = (1024, 10_000)


async def _publish(subscribers: int) -> dict[str, float]:
    bus = EventBus()
    if hasattr(bus, "max_subscribers"):
        bus.max_subscribers = max(bus.max_subscribers, 1)  # the shipped cap stays as it is
    streams = [bus.subscribe() for _ in range(subscribers)]
    bus.publish("node", {"n": -1})
    for stream in streams:  # each reads the history once, then stops reading (idle)
        await anext(stream)
    publish, with_fan_out = [], []
    for i in range(300):
        began = time.perf_counter()
        bus.publish("node", {"n": i})
        publish.append(time.perf_counter() - began)
        await asyncio.sleep(0)
        with_fan_out.append(time.perf_counter() - began)
    open_now = getattr(bus, "subscriber_count", subscribers)
    for stream in streams:
        await stream.aclose()
    return {"publish_us": statistics.median(publish) * 1e6,
            "publish_fanout_us": statistics.median(with_fan_out) * 1e6,
            "open_subscribers": float(open_now)}


def _wide(models: int) -> Router:
    router = Router(RouterConfig(), clock=lambda: 1_000_000.0)
    for i in range(models):
        for j in range(3):
            router.upsert_node(NodeRecord(f"n{i}-{j}", f"m{i}", 0, 39, 40,
                                          f"http://127.0.0.1:9/{i}/{j}", 10.0 + j))
    return router


def _timed(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        began = time.perf_counter()
        fn()
        times.append(time.perf_counter() - began)
    return statistics.median(times) * 1000.0


def _decision_after_change(nodes: int) -> float:
    router = Router(RouterConfig(), clock=lambda: 1_000_000.0)
    for i in range(nodes):  # heads and tails of one model, like bench_core's meshes
        start, end = (0, 19) if i % 2 == 0 else (20, 39)
        router.upsert_node(NodeRecord(f"n{i}", "m", start, end, 40,
                                      f"http://127.0.0.1:9/{i}", 10.0 + i % 7))
    times = []
    for k in range(7):
        node = NodeRecord("n0", "m", 0, 19, 40, "http://127.0.0.1:9/0", 10.0, queue=k + 1)
        began = time.perf_counter()
        router.upsert_node(node)
        decision = router.choose("m")
        times.append(time.perf_counter() - began)
        router.cancel(decision)
    return statistics.median(times) * 1000.0


def measure() -> dict[str, Any]:
    """Everything, against whichever meshroute_middleware is imported."""
    out: dict[str, Any] = {"events": {}, "scrape": {}, "decision_after_change_ms": {}}
    for s in SUBSCRIBERS:
        out["events"][str(s)] = asyncio.run(_publish(s))
    for m in MODELS:
        router = _wide(m)
        telemetry = Telemetry(router)
        out["scrape"][str(m)] = {"metrics_ms": _timed(telemetry.render, 3),
                                 "routing_ms": _timed(router.routing_table, 3)}
    for n in BIG_MODEL:
        out["decision_after_change_ms"][str(n)] = _decision_after_change(n)
    return out


def baseline(rev: str) -> dict[str, Any]:
    """`measure` against meshroute_middleware as of `rev`, in a subprocess."""
    root = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        archive = subprocess.run(["git", "-C", str(root), "archive", rev,
                                  "meshroute_middleware"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
        proc = subprocess.run([sys.executable, __file__, "--json", "--expect-path", tmp],
                              env={**os.environ, "PYTHONPATH": tmp}, check=True,
                              capture_output=True, text=True)
    return json.loads(proc.stdout)  # type: ignore[no-any-return]


def table(now: dict[str, Any], before: dict[str, Any] | None) -> str:
    """Before / after, side by side."""
    def pair(path: list[str]) -> str:
        def get(d: dict[str, Any] | None) -> str:
            for key in path:
                if d is None:
                    return "-"
                d = d.get(key)
            return "-" if d is None else f"{float(d):,.1f}"  # type: ignore[arg-type]
        return f"{get(before):>10} {get(now):>10}"

    lines = [f"{'measure':<44} {'before':>10} {'after':>10}"]
    for s in SUBSCRIBERS:
        for key, label in (("publish_us", "publish µs"),
                           ("publish_fanout_us", "publish + fan-out µs"),
                           ("open_subscribers", "subscribers left open")):
            lines.append(f"{label + f', {s} idle subscribers':<44} "
                         + pair(["events", str(s), key]))
    for m in MODELS:
        lines.append(f"{f'/metrics scrape ms, {m} models x 3 heads':<44} "
                     + pair(["scrape", str(m), "metrics_ms"]))
        lines.append(f"{f'/v1/routing table ms, {m} models x 3 heads':<44} "
                     + pair(["scrape", str(m), "routing_ms"]))
    for n in BIG_MODEL:
        lines.append(f"{f'decision after a change ms, {n} nodes':<44} "
                     + pair(["decision_after_change_ms", str(n)]))
    return "\n".join(lines)


def main() -> int:
    """Parse flags, run, print, write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", metavar="REV", help="also measure at git REV")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--expect-path", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.json:
        import meshroute_middleware
        assert meshroute_middleware.__file__ is not None
        if args.expect_path and not meshroute_middleware.__file__.startswith(args.expect_path):
            raise SystemExit(f"baseline imported {meshroute_middleware.__file__}")
        print(json.dumps(measure()))
        return 0
    before = baseline(args.baseline) if args.baseline else None
    now = measure()
    print(table(now, before))
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "command": "python " + " ".join(sys.argv),
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "python": platform.python_version(), "cpus": os.cpu_count(),
        "after": now, "before": {"rev": args.baseline, "results": before}}, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
