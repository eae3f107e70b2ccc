"""Python bytecode instructions per forwarded chat request (a count, not a time):

  python benchmarks/count_forward.py [--requests 500] [--rounds 3]

The `meshroute serve` app forwards `--requests` sequential chat requests to an in-process chat
app (the in-memory forwarder of benchmarks/bench_overhead.py) under `sys.settrace` with opcode
events on, n then 2n of them so that a batch's fixed cost cancels; it prints the instructions
executed per request in all Python code, and in meshroute's modules outside its core and its
timers: the dispatch, intake and forwarding path, the same count run after run (the core's
share drifts as the policy learns, a timer's follows the wall clock). A change that claims
"no slower" compares these before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._apps import chat  # noqa: E402
from benchmarks.bench_overhead import BODY, HEAD, SCOPE, gateway_app  # noqa: E402
from meshroute_middleware.forwarding.memory import ASGIForwarder  # noqa: E402
from meshroute_middleware.http.request import replay  # noqa: E402

OURS = str(ROOT / "meshroute_middleware")
# the routing core's share drifts as the policy learns (its saturation posterior changes with
# the samples taken and the wall clock): the adapters' share, the rest, does not
CORE = str(ROOT / "meshroute_middleware" / "core")
# code that runs on a timer, whose count follows the wall clock rather than the requests
TIMED = {(str(ROOT / "meshroute_middleware" / "chat" / "watchdog.py"), "_sweep")}


async def serve(app: Any, n: int) -> None:
    async def send(message: Any) -> None:
        if message["type"] == "http.response.start" and message["status"] != 200:
            raise SystemExit(f"answered {message['status']}: the count would flatter")

    async def never() -> Any:
        await asyncio.sleep(3600)

    for _ in range(n):
        await app({**SCOPE, "state": {}}, replay(BODY, never), send)


def count(app: Any, n: int) -> tuple[int, int]:
    """(all instructions, meshroute's outside its core) executed serving n requests."""
    total = ours = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal total, ours
        if event == "call":
            frame.f_trace_opcodes = True
            name = frame.f_code.co_filename
            mine = (name.startswith(OURS) and not name.startswith(CORE)
                    and (name, frame.f_code.co_name) not in TIMED)

            def local(frame: FrameType, event: str, arg: Any) -> Any:
                nonlocal total, ours
                if event == "opcode":
                    total += 1
                    ours += mine
                return local
            return local
        return None

    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(serve(app, 200))  # warm up: caches, first enumeration
        sys.settrace(tracer)
        try:
            loop.run_until_complete(serve(app, n))
        finally:
            sys.settrace(None)
    finally:
        loop.close()
    return total, ours


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    app = gateway_app(ASGIForwarder({HEAD: chat}))
    n = args.requests
    runs = []
    for _ in range(args.rounds):  # a batch's fixed cost cancels out: 2n requests minus n
        (t1, o1), (t2, o2) = count(app, n), count(app, 2 * n)
        runs.append(((t2 - t1) / n, (o2 - o1) / n))
    print(f"| forward path, per request ({n} vs {2 * n} requests) | bytecode instructions "
          f"(median of {args.rounds}) |\n|---|---:|")
    print(f"| all Python code | {statistics.median(r[0] for r in runs):.0f} |")
    ours = sorted(r[1] for r in runs)
    print(f"| meshroute_middleware outside core/ (and timers) | {statistics.median(ours):.1f} "
          f"(min {ours[0]:.1f}, max {ours[-1]:.1f}) |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
