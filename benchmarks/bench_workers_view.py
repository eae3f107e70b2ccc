"""What `--workers N` as one gateway costs (telemetry/workers.py, relay.py, worker_files.py):

  python benchmarks/bench_workers_view.py [--events 20000] [--rounds 5] [--no-save]
  PYTHONPATH=OLD_DIR python benchmarks/bench_workers_view.py --single-only   # another checkout

Per event, in one process, CPU time (the least of `--rounds` rounds):
- `single publish`: EventBus.publish_lazy of an outcome event, no subscriber (a one-process
  gateway's request path, twice per request);
- `worker publish`: WorkerEventBus.publish_lazy (the request path of a worker of several);
- `worker flush`: rendering and encoding a batch for the siblings (Relay.flush, batches of
  `--batch` events), per event;
- `sibling ingest`: parsing a line and adding its events to a sibling's bus, per event.
Per scrape: a worker's file snapshot (`sync`, every 0.5 s and before a scrape) and a whole
render (sync + merge of two workers' files + exposition), with `--models` models' series.
End to end (`--e2e-requests N`): CPU seconds per chat request summed over the workers of
`meshroute serve --workers 2` (an instant in-process backend, 8 keep-alive clients), this
checkout against `--old ROOT` (a checkout without the one-gateway view), rounds interleaved,
the least of `--rounds` each.
Writes benchmarks/results/workers_view.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from meshroute_middleware.core import Outcome
from meshroute_middleware.middleware import build_router
from meshroute_middleware.telemetry.events import EventBus
from meshroute_middleware.telemetry.metrics import Telemetry, _outcome_fields
from meshroute_middleware.telemetry.requests import RequestTally

OUT = Path(__file__).parent / "results" / "workers_view.json"
CONTENT = (("mesh", "a>b", "m", 0, "a", "throughput"), Outcome(40, 0.8, 0.1, ""), "sample")


def per_call(fn: Callable[[], Any], n: int, rounds: int) -> float:
    """Least CPU seconds per call over `rounds` rounds of n calls."""
    best = float("inf")
    for _ in range(rounds):
        start = time.process_time()
        for _ in range(n):
            fn()
        best = min(best, (time.process_time() - start) / n)
    return best


def single_publish(n: int, rounds: int) -> float:
    bus = EventBus()
    return per_call(lambda: bus.publish_lazy("outcome", _outcome_fields, CONTENT), n, rounds)


def worker_costs(n: int, rounds: int, batch: int) -> dict[str, float]:
    from meshroute_middleware.telemetry.relay import WorkerEventBus, encode

    bus = WorkerEventBus(0, 2)
    publish = per_call(lambda: bus.publish_lazy("outcome", _outcome_fields, CONTENT), n,
                       rounds)
    bus.take_outbox()
    for _ in range(batch):
        bus.publish_lazy("outcome", _outcome_fields, CONTENT)
    entries = bus.take_outbox()
    flush = per_call(lambda: encode(entries), max(1, n // batch), rounds) / batch
    line = encode(entries)
    sibling = WorkerEventBus(1, 2)
    ingest = per_call(lambda: sibling.ingest(json.loads(line)), max(1, n // batch),
                      rounds) / batch
    return {"worker_publish_s": publish, "worker_flush_s": flush, "sibling_ingest_s": ingest}


def metrics_costs(models: int, rounds: int) -> dict[str, float]:
    from meshroute_middleware.telemetry.worker_files import WorkerFiles
    from meshroute_middleware.telemetry.workers import WorkerMetrics, WorkersDir

    directory = WorkersDir.create(2).path  # where a run's files go (/dev/shm where there is)
    try:
        workers = []
        for pid in (1, 2):
            telemetry = Telemetry(build_router())
            telemetry.requests = RequestTally()
            for m in range(models):
                for result in ("sample", "success", "failure"):
                    telemetry.outcomes[(f"model-{m}", result)] = m + 1
                telemetry.decisions[(f"model-{m}", "mesh")] = m + 1
            telemetry.workers = WorkerMetrics(WorkerFiles(directory, pid))
            workers.append(telemetry)
        a = workers[0]
        assert a.workers is not None
        workers[1].workers.sync(workers[1])  # type: ignore[union-attr]
        unchanged = per_call(lambda: a.workers.sync(a), 20, rounds)  # type: ignore[union-attr]

        def changed() -> None:
            a.decisions[("model-0", "mesh")] += 1
            a.workers.sync(a)  # type: ignore[union-attr]

        sync = per_call(changed, 20, rounds)
        render = per_call(lambda: a.render(), 20, rounds)
        series = sum(1 for line in a.render().splitlines() if not line.startswith(b"#"))
        return {"sync_unchanged_s": unchanged, "sync_changed_s": sync, "render_s": render,
                "series": series, "directory": str(directory.parent)}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def _cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    return [int(c) for task in Path(f"/proc/{pid}/task").iterdir()
            for c in (task / "children").read_text().split()]


def e2e_cpu_per_request(root: Path, backend: str, requests: int, tmp: Path) -> float:
    """CPU seconds per request, summed over the workers of a 2-worker gateway run from
    `root`, for `requests` chat requests from 8 keep-alive clients."""
    import httpx

    from tests.upstream import free_port

    nodes = tmp / "nodes.json"
    nodes.write_text(json.dumps([{"node_id": "b", "model": "m", "start": 0, "end": 9,
                                  "layers": 10, "url": backend, "tps": 10.0}]))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "meshroute_middleware.app.cli", "serve",
                             "--workers", "2", "--port", str(port), "--no-mdns",
                             "--nodes-file", str(nodes), "--log-level", "warning"], cwd=root)
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    try:
        deadline = time.monotonic() + 120
        while len(_children(proc.pid)) < 2 or not _up(url):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the gateway did not start")
            time.sleep(0.2)
        time.sleep(2)  # start-up work (gossip's first rounds) out of the way
        workers = _children(proc.pid)
        before = sum(_cpu(w) for w in workers)

        def client(n: int) -> None:
            with httpx.Client(base_url=url, timeout=30) as c:
                for _ in range(n):
                    c.post("/v1/chat/completions", json=body).raise_for_status()

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(client, [requests // 8] * 8))
        return (sum(_cpu(w) for w in workers) - before) / (requests // 8 * 8)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


def _up(url: str) -> bool:
    import httpx
    try:
        return httpx.get(url + "/healthz", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def e2e(old: Path, requests: int, rounds: int) -> dict[str, float]:
    from tests.upstream import FakeChat, ServerThread

    here = Path(__file__).resolve().parent.parent
    best = {"e2e_view_cpu_per_request_s": float("inf"),
            "e2e_old_cpu_per_request_s": float("inf")}
    tmp = Path(tempfile.mkdtemp(prefix="mr-e2e-"))
    try:
        with ServerThread(FakeChat("b", tokens=5).app()) as up:
            for _ in range(rounds):
                for key, root in (("e2e_view_cpu_per_request_s", here),
                                  ("e2e_old_cpu_per_request_s", old)):
                    best[key] = min(best[key], e2e_cpu_per_request(root, up.url, requests, tmp))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--events", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--models", type=int, default=100)
    parser.add_argument("--single-only", action="store_true")
    parser.add_argument("--e2e-requests", type=int, default=0)
    parser.add_argument("--old", type=Path, help="a checkout without the view (--e2e-requests)")
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                              "load": os.getloadavg(),
                              "single_publish_s": single_publish(args.events, args.rounds)}
    if not args.single_only:
        result.update(worker_costs(args.events, args.rounds, args.batch))
        result.update(metrics_costs(args.models, args.rounds))
    if args.e2e_requests and args.old:
        result.update(e2e(args.old, args.e2e_requests, args.rounds))
    for key, value in result.items():
        if key.endswith("_s"):
            print(f"{key:20} {value * 1e6:10.2f} µs")
        else:
            print(f"{key:20} {value}")
    if not args.no_save and not args.single_only:
        OUT.parent.mkdir(exist_ok=True)
        OUT.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
