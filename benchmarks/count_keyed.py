"""What a client key costs, counted rather than timed (issue 32, "a key costs little"):

  valgrind --tool=callgrind --callgrind-out-file=OUT \
      python benchmarks/count_keyed.py VARIANT N           # N = 200 and 1200
  python benchmarks/count_keyed.py --bytecodes [--requests 200] [--json OUT]

VARIANT is one of VARIANTS: the unkeyed gateway (`unkeyed`), the same gateway with one
`[[clients]]` client whose key every request carries, without limits (`plain`) or with rpm,
tpm, daily_tokens and monthly_usd set high enough never to refuse (`limits`: this process's
memory, the store of a gateway without a state file), and the state-file pair (`unkeyed-file`,
`limits-file`: what `--workers N` share). The app and the request are bench_overhead.py's, the
clocks are forward_instructions.py's `--fixed-clock` ones (the routing clock, which the
clients' windows also read, steps 10 ms per request; `time.perf_counter` 1 ms per call; the
watchdog's sweep put off), so a count follows the code run, not how fast the machine runs it.

The usage written behind (chat/ledger.py) waits FLUSH_S of wall-clock time between writes:
natively that is one write per ~FLUSH_S / REQUEST_S requests, under callgrind (50-100x
slower) one per request or two. Here the writer's sleep is counted in requests instead
(`Ticks`: REQUEST_S per request, the unkeyed gateway's native CPU time per request in
bench_overhead), and what is queued at the end is flushed inside the count.

Per request under callgrind = (Ir(1200) - Ir(200)) / 1000 (start-up cancels out).
`--bytecodes` runs every variant under `sys.settrace` opcode events (n then 2n requests after
20 of warm-up; per request = the difference / n) and prints each keyed variant's count over
its unkeyed one: all Python, and meshroute's code outside the learning core.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._apps import chat
from benchmarks.bench_overhead import BODY, HEAD, KEY, KEYED_SCOPE, SCOPE
from benchmarks.forward_instructions import STEP_S, fixed_clocks
from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import parse_node
from meshroute_middleware.core.clients import ClientTable, key_digest
from meshroute_middleware.forwarding.memory import ASGIForwarder
from meshroute_middleware.http.request import replay

REQUEST_S = 250e-6  # the unkeyed gateway's native CPU time per request (bench_overhead, quiet)
LEARNING = ("/core/saturation.py", "/core/policies/")
_DIGEST = "sha256:" + key_digest(KEY).hex()
PLAIN = ClientTable("bench", _DIGEST)
LIMITED = ClientTable("bench", _DIGEST, rpm=10**9, tpm=10**12, daily_tokens=10**12,
                      monthly_usd=1e12)
# variant -> (its client, in a state file, the unkeyed variant it is compared with)
VARIANTS: dict[str, tuple[ClientTable | None, bool, str]] = {
    "unkeyed": (None, False, "unkeyed"), "plain": (PLAIN, False, "unkeyed"),
    "limits": (LIMITED, False, "unkeyed"), "unkeyed-file": (None, True, "unkeyed-file"),
    "limits-file": (LIMITED, True, "unkeyed-file")}


class Ticks:
    """A sleep measured in requests: `sleep(s)` ends once s / REQUEST_S more requests were
    served (`tick` after each)."""

    def __init__(self) -> None:
        self.served = 0
        self._due: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    async def sleep(self, seconds: float) -> None:
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._due, (self.served + seconds / REQUEST_S, next(self._order),
                                   future))
        await future

    def tick(self) -> None:
        self.served += 1
        while self._due and self._due[0][0] <= self.served:
            future = heapq.heappop(self._due)[2]
            if not future.done():
                future.set_result(None)


class Driver:
    """One variant's gateway on the fixed clocks, serving sequential requests."""

    def __init__(self, variant: str, state_dir: str) -> None:
        client, filed, _ = VARIANTS[variant]
        self.now = [1_000_000.0]
        self.ticks = Ticks()
        settings = replace(ServeSettings(), mdns=False, seed=1,
                           clients=() if client is None else (client,),
                           state_file=str(Path(state_dir) / f"{variant}.db") if filed else None)
        gateway = build_gateway(settings, forwarder=ASGIForwarder({HEAD: chat}),
                                clock=lambda: self.now[0])
        gateway.mesh.upsert(parse_node({"node_id": "b", "model": "m", "start": 0, "end": 39,
                                        "layers": 40, "url": HEAD}))
        self.app = gateway.app
        self.ledger = gateway.spend.ledger if gateway.spend is not None else None
        if self.ledger is not None:
            self.ledger._sleep = self.ticks.sleep  # the writer's wait, in requests
        self.scope = KEYED_SCOPE if client is not None else SCOPE
        self.statuses: list[int] = []

    async def send(self, message: Any) -> None:
        if message["type"] == "http.response.start":
            self.statuses.append(message["status"])

    async def serve(self, n: int) -> None:
        async def never() -> Any:
            await asyncio.sleep(3600)

        for _ in range(n):
            self.now[0] += STEP_S
            await self.app({**self.scope, "state": {}}, replay(BODY, never), self.send)
            self.ticks.tick()
        if self.ledger is not None:
            await self.ledger.flush()
        if set(self.statuses) != {200}:
            raise SystemExit(f"not every request was answered 200: {set(self.statuses)}")


def bytecodes(requests: int) -> dict[str, dict[str, float]]:
    """Each variant's bytecodes per request, per function (sys.settrace opcode events)."""
    counts: dict[str, int] = {}

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        code = frame.f_code
        key = f"{code.co_filename}:{code.co_name}"

        def local(frame: FrameType, event: str, arg: Any) -> Any:
            if event == "opcode":
                counts[key] = counts.get(key, 0) + 1
            return local
        return local

    async def run(variant: str, state_dir: str) -> dict[str, float]:
        driver = Driver(variant, state_dir)
        await driver.serve(20)
        totals = []
        for k in (requests, 2 * requests):
            counts.clear()
            sys.settrace(tracer)
            await driver.serve(k)
            sys.settrace(None)
            totals.append(dict(counts))
        first, second = totals
        return {key: (second.get(key, 0) - first.get(key, 0)) / requests
                for key in set(first) | set(second)}

    with tempfile.TemporaryDirectory(prefix="count-keyed-") as state_dir:
        return {v: asyncio.run(run(v, state_dir)) for v in VARIANTS}


def ours(key: str) -> bool:
    return "meshroute_middleware" in key and not any(p in key for p in LEARNING)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variant", nargs="?", choices=sorted(VARIANTS))
    parser.add_argument("n", nargs="?", type=int, default=200)
    parser.add_argument("--bytecodes", action="store_true")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    fixed_clocks()
    if not args.bytecodes:
        if args.variant is None:
            parser.error("a VARIANT, or --bytecodes")
        with tempfile.TemporaryDirectory(prefix="count-keyed-") as state_dir:
            asyncio.run(Driver(args.variant, state_dir).serve(args.n))
        return 0
    per = bytecodes(args.requests)
    print("| variant | all Python | ratio | meshroute (not learning) | ratio |\n"
          "|---|---:|---:|---:|---:|")
    for variant, (_, _, base) in VARIANTS.items():
        total, mine = sum(per[variant].values()), sum(
            v for k, v in per[variant].items() if ours(k))
        base_total, base_mine = sum(per[base].values()), sum(
            v for k, v in per[base].items() if ours(k))
        print(f"| {variant} | {total:.0f} | {total / base_total:.3f}× | {mine:.0f} | "
              f"{mine / base_mine:.3f}× |")
    if args.json:
        Path(args.json).write_text(json.dumps(per, indent=0, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
