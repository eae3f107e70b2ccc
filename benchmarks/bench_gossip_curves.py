"""What gossiped saturation curves are worth (issue 14): a tracker that starts from a peer's.

Simulated, on the real Router and policy (`meshroute_middleware.core.sim`): tracker A serves a whole
scenario with thompson; then a fresh tracker B serves the first N requests of the same mesh
(another workload seed), starting either cold, with A's statistics as gossip delivers them
without curves (the per-route means only, as before issue 14), or with them and A's curve
summaries. The entries are A's `stats.state()` under origin "a", re-dated to B's start, as one
gossip exchange would leave them. Reported: B's delivered tokens/s over its first N requests as
a fraction of the oracle's on the same requests, mean over seeds.

    python benchmarks/bench_gossip_curves.py [--seeds 5] [--requests 100 400]
Writes benchmarks/results/gossip_curves.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from functools import cache
from pathlib import Path
from typing import Any

from meshroute_middleware.core.sim.engine import Simulator
from meshroute_middleware.core.sim.metrics import throughput
from meshroute_middleware.core.sim.scenarios import SCENARIOS
from meshroute_middleware.core.stats import State

NAMES = ("9-batch-roomy", "10-batch-saturates", "11-serial", "12-bursty")
VARIANTS = ("cold", "means", "curves")
RESULTS = Path(__file__).parent / "results" / "gossip_curves.json"


@cache
def learned_by_a(name: str, seed: int) -> State:
    """A's statistics after a whole run, as B holds them after gossip: origin "a", dated 0."""
    scenario = next(s for s in SCENARIOS if s.name == name)
    sim = Simulator(scenario, "thompson", seed)
    sim.run()
    own = sim.router.stats.origin
    return {key: {"a": origins[own]._replace(t=0.0)}
            for key, origins in sim.router.stats.state().items() if own in origins}


def run_b(name: str, seed: int, requests: int, state: State | None) -> float:
    """B's delivered tokens/s over the first `requests` requests (None: the oracle)."""
    scenario = replace(next(s for s in SCENARIOS if s.name == name), requests=requests)
    sim = Simulator(scenario, "oracle" if state is None else "thompson", seed)
    if state:
        sim.router.stats.merge(state)
    return throughput(sim.run())


def measure(name: str, seed: int, requests: int) -> dict[str, float]:
    """Fractions of the oracle per variant for one scenario, seed and length."""
    full = learned_by_a(name, seed)
    bare = {k: {o: e._replace(curve=None) for o, e in v.items()} for k, v in full.items()}
    states = {"cold": {}, "means": bare, "curves": full}
    oracle = run_b(name, seed + 1000, requests, None)
    return {v: run_b(name, seed + 1000, requests, states[v]) / oracle for v in VARIANTS}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--requests", type=int, nargs="+", default=[100, 400])
    args = parser.parse_args(argv)
    rows: list[dict[str, Any]] = []
    print(f"| scenario | B's first N | {' | '.join(VARIANTS)} |")
    print("|---|---:|" + "---:|" * len(VARIANTS))
    for name in NAMES:
        for n in args.requests:
            runs = [measure(name, seed, n) for seed in range(1, args.seeds + 1)]
            mean = {v: statistics.fmean(r[v] for r in runs) for v in VARIANTS}
            rows.append({"scenario": name, "requests": n, "seeds": args.seeds,
                         "mean": mean, "runs": runs})
            print(f"| {name} | {n} | " + " | ".join(f"{mean[v]:.3f}" for v in VARIANTS) + " |")
            sys.stdout.flush()
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
