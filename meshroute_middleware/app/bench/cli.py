"""`meshroute bench learning`: every policy on every scenario, as a table and JSON."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from meshroute_middleware.app.bench.harness import (
    CONVERSATION_POLICIES,
    FULL_SEEDS,
    POLICIES,
    QUICK_SEEDS,
    Cells,
    bar,
    execute,
    markdown,
    plan,
    report,
    summarize,
)
from meshroute_middleware.core.sim.scenarios import (
    CONVERSATION_SCENARIOS,
    MESH_SCENARIOS,
    SCENARIOS,
    by_name,
)

BENCHMARKS = ("learning",)
# The default policy's constants were tuned on seeds 1-4 of every scenario but the held-out
# ones (Scenario.held_out); the held-out seeds start here and were never run while tuning.
TUNING_SEED, HELD_OUT_SEED = 1, 1001


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `meshroute bench`."""
    parser.add_argument("benchmark", choices=BENCHMARKS, help="which benchmark to run")
    parser.add_argument("--json", metavar="PATH", type=Path, help="write the report here")
    parser.add_argument("--quick", action="store_true",
                        help="short runs on one seed (seconds, for tests and CI)")
    parser.add_argument("--seed", type=int, default=None,
                        help=f"first seed (default {TUNING_SEED}; --held-out: {HELD_OUT_SEED})")
    parser.add_argument("--held-out", action="store_true",
                        help="seeds never used while tuning the default policy")
    parser.add_argument("--scenario", action="append", metavar="NAME",
                        help="only this scenario (name or number; repeatable)")
    parser.add_argument("--conversations", action="store_true",
                        help="the multi-turn scenarios on prefix-caching nodes instead "
                             "(issue 26; not in the default set)")
    parser.add_argument("--mesh", action="store_true",
                        help="the slot-limited meshes, one tracker and three "
                             "(issue 31; not in the default set)")
    parser.add_argument("--seeds", type=int, default=None,
                        help=f"seeds per (scenario, policy) (default {FULL_SEEDS}; --quick: "
                             f"{QUICK_SEEDS})")
    parser.add_argument("--policy", action="append", metavar="NAME",
                        choices=sorted({*POLICIES[1:], *CONVERSATION_POLICIES[1:]}),
                        help="only this policy beside the oracle (repeatable; default: all)")
    parser.add_argument("--workers", type=int, default=0,
                        help="processes (default: 1 with --quick, else the CPU count)")


def learning(quick: bool = False, seed: int = 1, scenarios: list[str] | None = None,
             workers: int = 0, progress: bool = True, seeds: int | None = None,
             policies: list[str] | None = None, conversations: bool = False,
             mesh: bool = False) -> Cells:
    """Run the learning-quality benchmark: per scenario and policy, the averaged results
    (when none is named, `conversations`: the multi-turn scenarios; `mesh`: the
    slot-limited meshes and several trackers)."""
    default = (CONVERSATION_SCENARIOS if conversations else MESH_SCENARIOS if mesh
               else SCENARIOS)
    chosen = [by_name(n) for n in scenarios] if scenarios else list(default)
    names = ("oracle", *policies) if policies else POLICIES
    jobs = plan(quick, seed, chosen, names, seeds=seeds)
    if workers <= 0:
        workers = 1 if quick else (os.cpu_count() or 1)
    results = execute(jobs, workers, bar() if progress else None)
    return summarize(jobs, results)


def run(args: argparse.Namespace) -> int:
    """Entry point of `meshroute bench learning`."""
    started = time.perf_counter()
    seed = args.seed if args.seed is not None else (
        HELD_OUT_SEED if args.held_out else TUNING_SEED)
    try:
        cells = learning(args.quick, seed, args.scenario, args.workers, seeds=args.seeds,
                         policies=args.policy, conversations=args.conversations,
                         mesh=args.mesh)
    except KeyError as exc:
        print(f"meshroute bench: {exc.args[0]}", file=sys.stderr)
        return 2
    print(markdown(cells))
    held_out = ", ".join(s.name for s in SCENARIOS if s.held_out)
    print(f"\n({'quick' if args.quick else 'full'} run, seeds from {seed}"
          f"{' (held out)' if seed >= HELD_OUT_SEED else ''}; held-out scenarios: {held_out}; "
          f"{time.perf_counter() - started:.1f} s)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report(cells), indent=2) + "\n")
    return 0
