"""What the access log (app/access.py, issue 33) costs per chat request, in-process:

  python benchmarks/bench_access_log.py [--requests 1500] [--rounds 8]

The `meshroute serve` app of bench_overhead forwards to an in-process chat app; rounds
alternate the `meshroute.access` logger off (WARNING) and on (INFO, its line written to
/dev/null through the command's own handler). CPU time per request, medians.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._apps import chat  # noqa: E402
from benchmarks.bench_overhead import BODY, HEAD, SCOPE, gateway_app  # noqa: E402
from meshroute_middleware.app.logs import configure_logging  # noqa: E402
from meshroute_middleware.forwarding.memory import ASGIForwarder  # noqa: E402
from meshroute_middleware.http.request import replay  # noqa: E402


async def cpu_us(app: Any, n: int) -> float:
    async def send(message: Any) -> None:
        pass

    async def never() -> Any:
        await asyncio.sleep(3600)

    start = time.process_time()
    for _ in range(n):
        await app({**SCOPE, "state": {}}, replay(BODY, never), send)
    return (time.process_time() - start) / n * 1e6


async def measure(requests: int, rounds: int) -> dict[str, float]:
    access = logging.getLogger("meshroute.access")
    app = gateway_app(ASGIForwarder({HEAD: chat}))
    await cpu_us(app, 500)
    samples: dict[str, list[float]] = {"off": [], "on": []}
    for _ in range(rounds):
        for mode, values in samples.items():
            access.setLevel(logging.WARNING if mode == "off" else logging.INFO)
            values.append(await cpu_us(app, requests))
    return {mode: statistics.median(v) for mode, v in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    out = os.dup(1)
    os.dup2(os.open(os.devnull, os.O_WRONLY), 2)  # the log lines go nowhere
    configure_logging("info")
    got = asyncio.run(measure(args.requests, args.rounds))
    table = ("| access log | µs CPU per request |\n|---|---:|\n"
             f"| off | {got['off']:.1f} |\n| on | {got['on']:.1f} |\n"
             f"| on − off | {got['on'] - got['off']:.1f} |\n"
             f"| on / off | {got['on'] / got['off']:.2f}× |\n")
    os.write(out, table.encode())


if __name__ == "__main__":
    main()
