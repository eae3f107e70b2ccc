"""Shared key gates (issue 23): the time one provider request spends in the gates.

One request = take a key (`acquire`: check every key, pick, reserve) + settle its tokens from
`usage` after the answer (+ the ladder's reset when it had strikes: none here), as the chat
path does it, on one route with two keys and every limit set high enough never to refuse:
- `local`: the process's own KeyGates (today's behaviour with one worker);
- `state-file`: SqliteLimits on a state file in a temporary directory (WAL, NORMAL);
  `state-file x2` adds a second process taking keys on the same file meanwhile, one request
  per millisecond (a busy sibling worker);
- `redis`: RedisLimits on a redis-server this script starts on a loopback port (if installed).
Each figure is µs per request, p50 and p99 over N requests, in this one run.

Run:  python benchmarks/bench_limits.py [-n 5000]
Writes benchmarks/results/limits.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from meshroute_middleware.core.providers.chain import provider_candidate
from meshroute_middleware.core.providers.config import ProvidersConfig, parse_providers_config
from meshroute_middleware.core.providers.router import ChainAttempt, ProviderRouter
from meshroute_middleware.core.providers.scoring import OutcomeKind
from meshroute_middleware.state.limits import LimitsStore
from meshroute_middleware.state.redis_limits import RedisLimits
from meshroute_middleware.state.shared_gates import SharedGates
from meshroute_middleware.state.sqlite_limits import SqliteLimits
from meshroute_middleware.state.store import StateStore

RESULTS = Path(__file__).parent / "results" / "limits.json"


def config() -> ProvidersConfig:
    return parse_providers_config({"providers": [
        {"name": "fastco", "base_url": "http://127.0.0.1:9/v1", "keys": ["env:A", "env:B"],
         "rpm": 10**9, "rpd": 10**9, "tpm": 10**12, "tpd": 10**12,
         "models": [{"id": "big-model", "tier": "large", "monthly_tokens": 10**12}]}]})


async def one_request(router: ProviderRouter, gates: SharedGates | None, now: float) -> float:
    """µs spent in the gates by one request (take, then settle with `usage`)."""
    candidate = provider_candidate(router.cfg.providers[0], router.cfg.providers[0].models[0])
    started = time.perf_counter()
    got = (router.acquire(candidate, 300, now) if gates is None
           else await gates.acquire(router, candidate, 300, now))
    assert isinstance(got, ChainAttempt)
    router.record(got, OutcomeKind.SUCCESS, now, used_tokens=280)
    return (time.perf_counter() - started) * 1e6


async def measure(store: LimitsStore | None, n: int) -> list[float]:
    cfg = config()
    gates = None if store is None else SharedGates(cfg, store, "bench")
    router = ProviderRouter(cfg, gates)
    now = time.time()
    for i in range(200):  # warm up
        await one_request(router, gates, now + i * 0.001)
    return [await one_request(router, gates, now + 1 + i * 0.001) for i in range(n)]


def summary(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50_us": statistics.median(ordered),
            "p99_us": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))],
            "n": len(ordered)}


def _contender(path: str, stop: Any) -> None:
    """A second process taking keys on the same state file until told to stop."""
    async def run() -> None:
        cfg = config()
        gates = SharedGates(cfg, SqliteLimits(path).open(), "contender")
        router = ProviderRouter(cfg, gates)
        while not stop.is_set():  # ~1,000 requests/s: a busy sibling worker, not a tight loop
            await one_request(router, gates, time.time())
            await asyncio.sleep(0.001)
    asyncio.run(run())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=5000, help="requests per mode")
    args = parser.parse_args()
    out: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                           "loadavg": os.getloadavg(), "modes": {}}
    out["modes"]["local"] = summary(asyncio.run(measure(None, args.n)))
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "state.db")
        StateStore(path).open().close()
        store = SqliteLimits(path).open()
        out["modes"]["state-file"] = summary(asyncio.run(measure(store, args.n)))
        stop = multiprocessing.get_context("spawn").Event()
        rival = multiprocessing.get_context("spawn").Process(target=_contender,
                                                             args=(path, stop))
        rival.start()
        time.sleep(1.0)
        out["modes"]["state-file x2"] = summary(asyncio.run(measure(store, args.n)))
        stop.set()
        rival.join(10)
        store.close()
        server = shutil.which("redis-server")
        if server is not None:
            port = free_port()
            proc = subprocess.Popen([server, "--port", str(port), "--bind", "127.0.0.1",
                                     "--save", "", "--appendonly", "no", "--dir", tmp],
                                    stdout=subprocess.DEVNULL)
            try:
                time.sleep(0.5)
                RedisLimits.check(f"redis://127.0.0.1:{port}/0")
                redis_store = RedisLimits(f"redis://127.0.0.1:{port}/0")
                out["modes"]["redis"] = summary(asyncio.run(measure(redis_store, args.n)))
            finally:
                proc.kill()
                proc.wait(10)
    print(f"{'gates':<16} {'p50 µs':>9} {'p99 µs':>9}   (n = {args.n}, load {out['loadavg']})")
    base = out["modes"]["local"]["p50_us"]
    for mode, row in out["modes"].items():
        print(f"{mode:<16} {row['p50_us']:9.1f} {row['p99_us']:9.1f}   "
              f"x{row['p50_us'] / base:.1f} local")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
