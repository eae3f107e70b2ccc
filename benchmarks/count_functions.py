"""Python bytecode instructions per forwarded chat request, per function (a count, not a time):

  python benchmarks/count_functions.py TREE [--requests 200] [--json OUT]

Runs TREE's `meshroute serve` app (TREE: a checkout, e.g. one made with `git archive`; its
benchmarks/forward_instructions.py must have `fixed_clock_app`) on `--requests` then twice as
many sequential chat requests under `sys.settrace` with opcode events, the routing clock
stepping 10 ms per request (and, with a driver that has `fixed_clocks`, `time.perf_counter`
1 ms per call and the watchdog's sweep put off: forward_instructions.py); per request =
(count at 2n − count at n) / n, per function. It
prints the total in meshroute's code that does not learn from measured speeds: every module
except the learning core (`core/saturation.py`, `core/policies/`, fed wall-clock timings of
the in-memory upstream, so its refits follow how slowly the process runs) and the watchdog's
timer. That part is the same run after run; compare it before and after a change, and diff
the `--json` files to see where it moved.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from types import FrameType
from typing import Any

LEARNING = ("/core/saturation.py", "/core/policies/")
TIMED = ("chat/watchdog.py:_sweep",)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tree")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    tree = args.tree.rstrip("/")
    sys.path.insert(0, tree)
    from benchmarks._apps import chat
    from benchmarks.bench_overhead import BODY, HEAD, SCOPE
    from benchmarks.forward_instructions import fixed_clock_app
    try:  # a driver from before the stepped clocks: the wall clock's
        from benchmarks.forward_instructions import fixed_clocks
        fixed_clocks()
    except ImportError:
        pass
    from meshroute_middleware.forwarding.memory import ASGIForwarder
    from meshroute_middleware.http.request import replay

    counts: dict[str, int] = {}

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        code = frame.f_code
        key = f"{code.co_filename.replace(tree, '')}:{code.co_name}"

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                counts[key] = counts.get(key, 0) + 1
            return local
        return local

    async def run(n: int) -> dict[str, float]:
        now = [1_000_000.0]
        app = fixed_clock_app(ASGIForwarder({HEAD: chat}), now)

        async def send(message: Any) -> None:
            pass

        async def never() -> Any:
            await asyncio.sleep(3600)

        async def batch(k: int) -> None:
            for _ in range(k):
                now[0] += 0.01
                await app({**SCOPE, "state": {}}, replay(BODY, never), send)

        await batch(20)  # warm
        totals = []
        for k in (n, 2 * n):
            counts.clear()
            sys.settrace(tracer)
            await batch(k)
            sys.settrace(None)
            totals.append(dict(counts))
        first, second = totals
        return {key: (second.get(key, 0) - first.get(key, 0)) / n
                for key in set(first) | set(second)}

    per = asyncio.run(run(args.requests))

    def steady(key: str) -> bool:
        return ("meshroute_middleware" in key and not any(p in key for p in LEARNING)
                and not any(key.endswith(t) for t in TIMED))

    print(f"all Python {sum(per.values()):.0f}  meshroute (not learning, not timed) "
          f"{sum(v for k, v in per.items() if steady(k)):.0f}  learning core "
          f"{sum(v for k, v in per.items() if any(p in k for p in LEARNING)):.0f}")
    if args.json:
        with open(args.json, "w") as out:
            json.dump(per, out, indent=0, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
