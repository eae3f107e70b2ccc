"""Gossip convergence: rounds until every tracker's routing view agrees, and bytes per round.

Simulated: N trackers with the real GossipService, wire codec (HMAC on) and state, on the
in-memory network with a fake clock. Every tracker measures both routes of one model with its
own tps (drawn 10..200 tokens/s), so a view is right only once it merged every origin. A round:
each tracker runs one push-pull round with `fanout` peers, concurrently; the clock steps one
interval. "Agree" = every tracker's merged tps of every route within 1 % of the merge over all
origins; "identical" = every tracker holds every origin's entry.

    python benchmarks/bench_gossip.py [--seeds 5] [--quick] [--no-delay]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import anyio

from gossip import state as st
from gossip.memory import MemoryNetwork
from gossip.service import GossipConfig, GossipService
from meshroute_middleware.core.config import RouterConfig
from meshroute_middleware.core.router import Router
from meshroute_middleware.core.stats import merge_view
from meshroute_middleware.core.topology import NodeRecord

MODEL = "m"
NODES = (NodeRecord("a", MODEL, 0, 9, 10, "http://127.0.0.1:9/a"),
         NodeRecord("b", MODEL, 0, 9, 10, "http://127.0.0.1:9/b"))
SIZES = (2, 8, 32, 128)
LOSSES = (0.0, 0.2)
FANOUTS = (3, 1)  # 3 is the default (--gossip-fanout); 1 shows push-pull alone
MAX_ROUNDS = 60
# Every message takes the same 2 ms (real time), so all exchanges of a round start together and
# a tracker passes on in the same round little of what it learned in that round; with no delay
# the exchanges of a round run one after another and chain, which flatters the round count.
DELAY_S = 0.002
RESULTS = Path(__file__).parent / "results" / "gossip.json"


class Clock:
    """The simulation's shared fake wall clock."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def make_tracker(i: int, n: int, clock: Clock, network: MemoryNetwork, fanout: int,
                 rng: random.Random) -> GossipService:
    """Tracker i of n: knows both nodes and every other tracker, has measured both routes."""
    router = Router(RouterConfig(), clock=clock, rng=random.Random(i), origin=f"t{i}")
    for node in NODES:
        router.upsert_node(node)
    for route in router.candidates(MODEL):
        router.stats.record_sample(MODEL, route.signature, rng.uniform(10, 200), 0.1, clock())
    address = (f"t{i}", 1)
    peers = tuple((f"t{j}", 1) for j in range(n) if j != i)
    config = GossipConfig(address, peers, interval_s=1e9, fanout=fanout,
                          secret=b"bench-secret", timeout_s=1.0)
    return GossipService(router, config, transport=network.transport(address),
                         rng=random.Random(rng.getrandbits(32)))


def truth(services: list[GossipService], now: float) -> dict[str, float]:
    """Per route, the merge over every tracker's own entry."""
    out: dict[str, float] = {}
    for route in services[0].router.candidates(MODEL):
        own = [s.router.stats.entries(MODEL, route.signature)[s.origin] for s in services]
        tps = merge_view(own, now, -math.inf, services[0].router.stats.half_life_s).tps
        assert tps is not None
        out[route.signature] = tps
    return out


def agrees(services: list[GossipService], now: float) -> bool:
    """Every tracker's merged tps of every route within 1 % of the truth."""
    want = truth(services, now)
    for s in services:
        for sig, tps in want.items():
            merged = s.router.stats.merged(MODEL, sig)
            got = merged.at(now).tps if merged is not None else None
            if got is None or abs(got - tps) > 0.01 * tps:
                return False
    return True


def identical(services: list[GossipService]) -> bool:
    """Every tracker holds every origin's entry of every route."""
    want = 2 * len(services)
    return all(len(st.flat_entries(s.router.stats)) == want for s in services)


async def one_round(services: list[GossipService], clock: Clock) -> None:
    clock.now += 1.0
    async with anyio.create_task_group() as tg:  # every tracker's exchanges, all awaited
        for s in services:
            for peer in s.pick():
                tg.start_soon(s.exchange, peer)


async def simulate(n: int, loss: float, fanout: int, seed: int,
                   delay_s: float = DELAY_S) -> dict[str, Any]:
    """Run rounds until every view agrees and every state is identical (or MAX_ROUNDS)."""
    clock, rng = Clock(), random.Random(seed)
    network = MemoryNetwork(seed, drop_rate=loss, delay_s=(delay_s, delay_s))
    services = [make_tracker(i, n, clock, network, fanout, rng) for i in range(n)]
    agree_at = same_at = None
    async with AsyncExitStack() as stack:
        for s in services:
            await stack.enter_async_context(s)
        for r in range(1, MAX_ROUNDS + 1):
            await one_round(services, clock)
            if agree_at is None and agrees(services, clock.now):
                agree_at = r
            if identical(services):
                same_at = r
                break
        converging_bytes = network.counters.bytes
        rounds_run = r
        await one_round(services, clock)  # steady state: digests only
        steady_bytes = network.counters.bytes - converging_bytes
    return {"agree_rounds": agree_at, "identical_rounds": same_at,
            "bytes_per_round_per_tracker": converging_bytes / rounds_run / n,
            "steady_bytes_per_round_per_tracker": steady_bytes / n}


def summarise(n: int, loss: float, fanout: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    goal = math.ceil(math.log2(n)) + 3
    agree = [r["agree_rounds"] or MAX_ROUNDS + 1 for r in runs]
    same = [r["identical_rounds"] or MAX_ROUNDS + 1 for r in runs]
    return {
        "trackers": n, "loss": loss, "fanout": fanout, "seeds": len(runs), "goal_rounds": goal,
        "agree_rounds_median": statistics.median(agree), "agree_rounds_max": max(agree),
        "identical_rounds_max": max(same), "max_over_goal": max(agree) / goal,
        "bytes_per_round_per_tracker": statistics.mean(
            r["bytes_per_round_per_tracker"] for r in runs),
        "steady_bytes_per_round_per_tracker": statistics.mean(
            r["steady_bytes_per_round_per_tracker"] for r in runs),
    }


HEADER = ("trackers", "loss", "fanout", "goal", "agree med", "agree max", "max/goal",
          "identical max", "B/round/tracker", "steady B/round/tracker")


def row(s: dict[str, Any]) -> tuple[str, ...]:
    return (str(s["trackers"]), f"{s['loss']:.0%}", str(s["fanout"]), str(s["goal_rounds"]),
            f"{s['agree_rounds_median']:g}", str(s["agree_rounds_max"]),
            f"{s['max_over_goal']:.2f}", str(s["identical_rounds_max"]),
            f"{s['bytes_per_round_per_tracker']:,.0f}",
            f"{s['steady_bytes_per_round_per_tracker']:,.0f}")


async def main_async(seeds: int, sizes: tuple[int, ...],
                     delay_s: float) -> list[dict[str, Any]]:
    summaries = []
    print(" | ".join(HEADER))
    for fanout in FANOUTS:
        for loss in LOSSES:
            for n in sizes:
                runs = [await simulate(n, loss, fanout, seed, delay_s) for seed in range(seeds)]
                summaries.append(summarise(n, loss, fanout, runs))
                print(" | ".join(row(summaries[-1])), flush=True)
    return summaries


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="runs per cell (seeds 0..n-1)")
    parser.add_argument("--quick", action="store_true", help="sizes 2 and 8 only")
    parser.add_argument("--no-delay", action="store_true",
                        help="deliver at once (exchanges of a round chain; fewer rounds)")
    args = parser.parse_args(argv)
    delay_s = 0.0 if args.no_delay else DELAY_S
    sizes = SIZES[:2] if args.quick else SIZES
    start = time.monotonic()
    summaries = anyio.run(main_async, args.seeds, sizes, delay_s)
    elapsed_s = time.monotonic() - start
    goal_met = all(s["agree_rounds_max"] <= s["goal_rounds"]
                   for s in summaries if s["loss"] == 0.0 and s["fanout"] == 3)
    print(f"goal (<= ceil(log2 N) + 3 rounds without loss, default fanout): "
          f"{'met' if goal_met else 'MISSED'}; {elapsed_s:.1f} s")
    if not args.quick and not args.no_delay:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps({"command": "python benchmarks/bench_gossip.py "
                                       f"--seeds {args.seeds}", "elapsed_s": elapsed_s,
                                       "goal_met": goal_met, "results": summaries}, indent=2))
    return 0 if goal_met else 1


if __name__ == "__main__":
    sys.exit(main())
