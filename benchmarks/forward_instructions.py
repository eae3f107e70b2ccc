"""A fixed number of forward-mode chat requests, for counting instructions under callgrind:

  valgrind --tool=callgrind --callgrind-out-file=/dev/null \
      python benchmarks/forward_instructions.py 200     # and again with 1200

The per-request count is the difference of the two totals over the difference of the counts
(start-up cancels out). Same app and request as bench_overhead.py's `gateway (forward)`; with
`--stream` the request asks for a stream. With `--fixed-clock` the routing clock advances
10 ms per request instead of following the wall clock: the beliefs' time decay, and so how
often a route's saturation curve is refitted, then no longer depends on how fast the process
runs (under callgrind, on a loaded machine, it runs 50-100x slower than natively, and the
refits a slower run makes show up as instructions per request); and `time.perf_counter`
steps 1 ms per call, so the upstream's measured speeds the policy learns from follow the code
run rather than the machine; and the disconnect watchdog's sweep (one timer every 20 ms of
wall-clock time, chat/watchdog.py) is put off past the run: natively a request lasts well under
a millisecond and a sweep comes once per dozens of requests, but under callgrind a request
lasts 20-100 ms, so most requests were seen by two sweeps and got a watcher task (with its
`receive` and its cancel), more of them the more loaded the machine was.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._apps import chat
from benchmarks.bench_overhead import BODY, HEAD, SCOPE, gateway_app
from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import parse_node
from meshroute_middleware.forwarding.memory import ASGIForwarder
from meshroute_middleware.http.request import replay

STREAM_BODY = json.dumps({"model": "m", "stream": True,
                          "messages": [{"role": "user", "content": "hi"}]}).encode()


STEP_S = 0.01  # the fixed clock's advance per request


def fixed_clock_app(forwarder: ASGIForwarder, now: list[float]) -> Any:
    """bench_overhead's gateway app with a routing clock that reads `now[0]`."""
    gateway = build_gateway(replace(ServeSettings(), mdns=False, seed=1),
                            forwarder=forwarder, clock=lambda: now[0])
    gateway.mesh.upsert(parse_node({"node_id": "b", "model": "m", "start": 0, "end": 39,
                                    "layers": 40, "url": HEAD}))
    return gateway.app


def fixed_clocks() -> None:
    """Step `time.perf_counter` (1 ms per call) and put the watchdog's sweep off past the run
    (see the module's docstring)."""
    time.perf_counter = _stepping_perf_counter()
    try:
        from meshroute_middleware.chat import watchdog
    except ImportError:  # a tree from before the watchdog
        return
    watchdog.WATCH_AFTER_S = 3600.0


def _stepping_perf_counter() -> Any:
    """A `time.perf_counter` that advances 1 ms per call: the upstream's measured speeds, which
    the policy learns from, then follow the code run, not how fast it runs."""
    ticks = [0]

    def perf_counter() -> float:
        ticks[0] += 1
        return ticks[0] * 0.001
    return perf_counter


async def run(n: int, body: bytes, fixed_clock: bool = False) -> None:
    now = [1_000_000.0]
    if fixed_clock:
        fixed_clocks()
    forwarder = ASGIForwarder({HEAD: chat})
    app = fixed_clock_app(forwarder, now) if fixed_clock else gateway_app(forwarder)
    statuses: list[int] = []

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def never() -> Any:
        await asyncio.sleep(3600)

    for _ in range(n):
        now[0] += STEP_S
        await app({**SCOPE, "state": {}}, replay(body, never), send)
    if statuses != [200] * n:
        raise SystemExit(f"not every request was answered 200: {set(statuses)}")


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    asyncio.run(run(n, STREAM_BODY if "--stream" in sys.argv else BODY,
                    fixed_clock="--fixed-clock" in sys.argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
