"""Reliability scenarios in the simulator (issue 34): a slow first-byte tail and streams
dying mid-way, under each policy of core/sim/reliability.py (the peers' static timeouts and
whole retries; learned deadlines; hedging at p95 with the default 5 % cap and a 15 % one;
mid-stream continuation). Pure and seeded: the figures do not depend on the machine.

For each scenario and policy: p99 and mean time to first token, upstream requests beyond
one per request, hedges per request, answers delivered whole, and delivered tokens/s (tokens
of whole answers over the clients' summed request time). Mean of `--seeds` seeds.

Run:  python benchmarks/bench_sim_reliability.py [--seeds N] [--requests N] [--json PATH]
Writes benchmarks/results/sim_reliability.json (or --json PATH).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
from pathlib import Path

from meshroute_middleware.core.sim import POLICIES, RELIABILITY_SCENARIOS, run_reliability

RESULTS = Path(__file__).parent / "results" / "sim_reliability.json"
COLUMNS = ("p99_ttft_s", "mean_ttft_s", "extra_upstream", "hedges", "whole", "delivered_tps")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=None)
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    out: dict[str, dict[str, dict[str, float]]] = {}
    for scenario in RELIABILITY_SCENARIOS:
        if args.requests is not None:
            scenario = dataclasses.replace(scenario, requests=args.requests)
        print(f"\n{scenario.name}: {scenario.description} ({scenario.requests} requests, "
              f"{args.seeds} seeds)")
        print(f"| policy | {' | '.join(COLUMNS)} |")
        print(f"|---|{'---:|' * len(COLUMNS)}")
        rows = out[scenario.name] = {}
        for policy in POLICIES:
            runs = [run_reliability(scenario, policy, seed).summary()
                    for seed in range(1, args.seeds + 1)]
            row = rows[policy.name] = {c: statistics.fmean(r[c] for r in runs) for c in COLUMNS}
            print(f"| {policy.name} | {row['p99_ttft_s']:.3f} s | {row['mean_ttft_s']:.3f} s | "
                  f"{row['extra_upstream']:+.1%} | {row['hedges']:.1%} | {row['whole']:.1%} | "
                  f"{row['delivered_tps']:.1f} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"seeds": args.seeds, "scenarios": out}, indent=1) + "\n")


if __name__ == "__main__":
    main()
