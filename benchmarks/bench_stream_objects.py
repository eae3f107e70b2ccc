"""What one open SSE stream costs the gateway's garbage collector: tracked objects per open
stream, by source and by type, and the CPU time of a full collection with them open.

  scripts/isolated python benchmarks/bench_stream_objects.py [--streams 300] [--json PATH]
      [--gateway-gc-threshold G0,G1,G2]

(re-runs itself under scripts/isolated.) One `meshroute serve` in front of one emulated node
that streams 1 token/s for longer than the run, so every stream opened stays open. The
gateway runs with benchmarks/_hooks, whose census (see its docstring) runs one full
collection, timed, then counts every tracked object by type and by where it comes from.
Censuses at N and 2N open streams; their difference divided by N is what one more open
stream keeps alive (the start-up heap and the first N's warm caches cancel out). A
development measurement, not a load test: each census stops the gateway for a moment.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import _procs as P

BODY = {"model": "paced", "stream": True, "max_tokens": 3600,
        "messages": [{"role": "user", "content": "hi"}]}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=300, help="N: censuses at N and 2N")
    p.add_argument("--settle-seconds", type=float, default=3.0,
                   help="wait after the streams are open, before each census")
    p.add_argument("--gateway-gc-threshold", metavar="G0,G1,G2")
    p.add_argument("--json", default=str(P.ROOT / "benchmarks/results/stream-objects.json"))
    p.add_argument("--no-isolate", action="store_true", help="don't re-run in scripts/isolated")
    return p.parse_args()


class Holder:
    """Opens streams and keeps them open (reading every chunk) until closed."""

    def __init__(self, url: str) -> None:
        self.url, self.open, self.failed = url, 0, 0
        self.errors: list[str] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, force_close=True),
            timeout=aiohttp.ClientTimeout(total=None))

    async def _one(self) -> None:
        counted = False
        try:
            async with self.session.post(self.url, json=BODY) as resp:
                if resp.status != 200:
                    raise RuntimeError(f"status {resp.status}: {(await resp.read())[:200]!r}")
                async for line in resp.content:
                    if line.startswith(b"data: ") and not counted:
                        counted = True
                        self.open += 1
        except (aiohttp.ClientError, RuntimeError) as exc:
            self.failed += 1
            self.errors.append(repr(exc)[:300])
        finally:
            if counted:
                self.open -= 1

    async def add(self, n: int, timeout_s: float = 120.0) -> None:
        target = self.open + n
        for i in range(n):
            self.tasks.append(asyncio.create_task(self._one()))
            if i % 50 == 49:
                await asyncio.sleep(0.05)
        deadline = time.monotonic() + timeout_s
        while (self.open < target and time.monotonic() < deadline
               and self.open + self.failed < target + 4):
            await asyncio.sleep(0.1)
        if self.open < target:
            raise RuntimeError(f"only {self.open} of {target} streams open ({self.failed} "
                               f"failed: {self.errors[:3]})")

    async def close(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        await self.session.close()


async def take_census(hook: Path, name: str, timeout_s: float = 60.0) -> dict[str, Any]:
    out = Path(f"{hook}.census-{name}.json")
    Path(f"{hook}.census").write_text(name)
    deadline = time.monotonic() + timeout_s
    while not out.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"no census {name} from the gateway")
        await asyncio.sleep(0.2)
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def per_stream(a: dict[str, int], b: dict[str, int], n: int) -> dict[str, float]:
    keys = set(a) | set(b)
    diff = {k: (b.get(k, 0) - a.get(k, 0)) / n for k in keys}
    return dict(sorted(((k, round(v, 2)) for k, v in diff.items() if abs(v) >= 0.05),
                       key=lambda kv: -abs(kv[1])))


async def run(args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    n = args.streams
    with P.processes() as procs:
        paced, _ = P.start_emulator(procs, "paced-0", "paced", 1.0, 2 * n + 64, 8 * n,
                                    logs / "paced.log")
        hook = logs / "loop-hook.jsonl"
        extra = ({"MESHROUTE_BENCH_GC_THRESHOLD": args.gateway_gc_threshold}
                 if args.gateway_gc_threshold else None)
        gw, _ = P.start_gateway(procs, {"paced-0": ("paced", paced)}, logs / "gw.log", hook,
                                extra_env=extra)
        holder = Holder(gw + "/v1/chat/completions")
        try:
            await holder.add(4)  # warm-up: pools, caches, first enumeration
            await asyncio.sleep(args.settle_seconds)
            c0 = await take_census(hook, "warm")
            await holder.add(n - 4)
            await asyncio.sleep(args.settle_seconds)
            c1 = await take_census(hook, "n")
            await holder.add(n)
            await asyncio.sleep(args.settle_seconds)
            c2 = await take_census(hook, "2n")
        finally:
            await holder.close()
    out: dict[str, Any] = {"streams": [n, 2 * n], "failed_streams": holder.failed}
    for key in ("tracked", "full_collection_wall_ms", "full_collection_cpu_ms", "frozen",
                "threshold"):
        out[key] = [c0[key], c1[key], c2[key]]
    out["tracked_per_stream"] = round((c2["tracked"] - c1["tracked"]) / n, 2)
    out["full_collection_cpu_ms_per_1000_streams"] = round(
        (c2["full_collection_cpu_ms"] - c1["full_collection_cpu_ms"]) * 1000 / n, 2)
    out["per_stream_by_source"] = per_stream(c1["by_source"], c2["by_source"], n)
    out["per_stream_by_type"] = per_stream(c1["by_type"], c2["by_type"], n)
    out["per_stream_by_source_type"] = per_stream(c1["by_source_type"], c2["by_source_type"], n)
    out["at_2n_by_source"] = c2["by_source"]
    return out


def report(res: dict[str, Any]) -> None:
    print(f"\nload average before/after: {res['meta']['load_average_before']} / "
          f"{res['meta']['load_average_after']}")
    print(f"tracked objects (warm, N, 2N): {res['tracked']}; per open stream: "
          f"{res['tracked_per_stream']}")
    print(f"full collection, wall ms: {res['full_collection_wall_ms']}, CPU ms: "
          f"{res['full_collection_cpu_ms']}")
    print("\nper open stream, by source:")
    for k, v in res["per_stream_by_source"].items():
        print(f"  {v:8.2f}  {k}")
    print("\nper open stream, by source and type:")
    for k, v in list(res["per_stream_by_source_type"].items())[:60]:
        print(f"  {v:8.2f}  {k}")


def main() -> int:
    return P.run_bench(__file__, parse_args(), run, report)


if __name__ == "__main__":
    sys.exit(main())
