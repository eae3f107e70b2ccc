"""How stale several trackers' view of one node's load is, and what that costs (issue 31).

Simulated, on the real Router and policy (`meshroute_middleware.core.sim`): the slot-limited
meshes with three trackers (21: 2/2/2 clients, 22: 4/1/1; 24: their conversations on
per-slot caches), each tracker seeing its own requests and what the nodes report, under
five ways of carrying the nodes' load to the trackers:

- none: nothing (each tracker counts only its own requests; before issue 31);
- answers: the node's count on every answer's first byte (`x-meshroute-load`) only;
- answers + 2 s: and the agent's refresh every 2 s (the scenarios' default);
- answers + 0.25 s: a refresh four times a second;
- exact: the true counts before every decision (instant, perfect sharing).

Reported per (scenario, view), mean over seeds: thompson's delivered tokens/s over the best
fixed split's (conversations: over the oracle's, and the mean time to first token over the
oracle's), how far a tracker's view of each route's load was from the truth at its
decisions (mean |view - truth|, requests), and the mean age of the nodes' last reports.

    python benchmarks/bench_load_view.py [--seed 1001] [--seeds 10] [--scenario 21 ...]
Writes benchmarks/results/load_view.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from meshroute_middleware.core.sim.engine import Simulator
from meshroute_middleware.core.sim.metrics import measure
from meshroute_middleware.core.sim.model import ANSWERS, EXACT, NONE, Scenario
from meshroute_middleware.core.sim.oracle import FIXED_SPLIT
from meshroute_middleware.core.sim.scenarios import by_name

RESULTS = Path(__file__).parent / "results" / "load_view.json"
VIEWS: tuple[tuple[str, str, float], ...] = (
    ("none", NONE, 0.0), ("answers", ANSWERS, 0.0), ("answers + 2 s", ANSWERS, 2.0),
    ("answers + 0.25 s", ANSWERS, 0.25), ("exact", EXACT, 0.0))


def run_view(scenario: Scenario, view: str, push_s: float, seed: int,
             base: float) -> dict[str, float]:
    """One run of thompson: its figures against `base` (the reference's tokens/s)."""
    sim = Simulator(replace(scenario, load_view=view, announce_s=push_s), "thompson", seed)
    m = measure(sim.run(), scenario.change_points())
    err, views = sim.load_error
    age, ages = sim.report_age
    return {"fraction": m.tokens_per_s / base, "ttft_s": m.mean_ttft_s,
            "view_error": err / views if views else 0.0,
            "report_age_s": age / ages if ages else 0.0}


def table(names: list[str], seeds: list[int]) -> dict[str, dict[str, dict[str, float]]]:
    """Per scenario and view, the means over seeds."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for name in names:
        scenario = by_name(name)
        talks = scenario.conversations is not None
        reference = "oracle" if talks else FIXED_SPLIT
        bases = {s: measure(Simulator(scenario, reference, s).run(), scenario.change_points())
                 for s in seeds}
        for label, view, push_s in VIEWS:
            runs = [run_view(scenario, view, push_s, s, bases[s].tokens_per_s) for s in seeds]
            cell = {k: statistics.fmean(r[k] for r in runs) for k in runs[0]}
            if talks:
                cell["ttft_of_oracle"] = statistics.fmean(
                    r["ttft_s"] / bases[s].mean_ttft_s for r, s in zip(runs, seeds, strict=True))
            out.setdefault(scenario.name, {})[label] = cell
            print(f"{scenario.name} {label}: {cell}", file=sys.stderr, flush=True)
    return out


def markdown(results: dict[str, dict[str, dict[str, float]]]) -> str:
    """The table: one row per (scenario, view)."""
    lines = ["| scenario | nodes' load reaches a tracker | tokens/s ÷ reference | "
             "TTFT ÷ oracle's | view error (requests) | report age s |",
             "|---|---|---:|---:|---:|---:|"]
    for name, views in results.items():
        for label, c in views.items():
            ttft = f"{c['ttft_of_oracle']:.3f}" if "ttft_of_oracle" in c else "—"
            lines.append(f"| {name} | {label} | {c['fraction']:.3f} | {ttft} | "
                         f"{c['view_error']:.3f} | {c['report_age_s']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=1001, help="first seed (held out)")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--scenario", action="append", metavar="NAME")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    seeds = [args.seed + k for k in range(args.seeds)]
    results = table(args.scenario or ["21", "22", "24"], seeds)
    print(markdown(results))
    doc: dict[str, Any] = {"seeds": seeds, "scenarios": results}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
