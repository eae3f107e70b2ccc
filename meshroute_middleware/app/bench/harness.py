"""Runs every policy on every scenario with the same seeds and builds the report."""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any, TextIO

from meshroute_middleware.core.config import RouterConfig
from meshroute_middleware.core.sim.engine import run
from meshroute_middleware.core.sim.metrics import RunMetrics, measure
from meshroute_middleware.core.sim.model import Scenario
from meshroute_middleware.core.sim.scenarios import SCENARIOS

POLICIES = ("oracle", "thompson", "adr0021", "epsilon-greedy", "litellm-latency", "petals",
            "freellmapi")
FULL_SEEDS, QUICK_SEEDS = 20, 1  # 20 seeds: standard errors of ~0.003 or less

Job = tuple[Scenario, str, int]
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True, slots=True)
class Cell:
    """One (scenario, policy) result averaged over seeds."""

    fraction_of_oracle: float
    p95_latency_s: float
    failed_rate: float
    reconverge_requests: float | None
    fraction_se: float = 0.0  # standard error of fraction_of_oracle over seeds (not in JSON)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of issue 6."""
        return {"fraction_of_oracle": round(self.fraction_of_oracle, 4),
                "p95_latency_s": round(self.p95_latency_s, 3),
                "failed_rate": round(self.failed_rate, 4),
                "reconverge_requests": (None if self.reconverge_requests is None
                                        else round(self.reconverge_requests))}


def run_job(job: Job) -> RunMetrics:
    """Simulate one scenario with one policy and seed (top level: picklable)."""
    scenario, policy, seed = job
    return measure(run(scenario, policy, seed), scenario.change_points())


def plan(quick: bool, seed: int, scenarios: Sequence[Scenario] = SCENARIOS,
         policies: Sequence[str] = POLICIES, seeds: int | None = None) -> list[Job]:
    """Every (scenario, policy, seed) run, the quick variant shorter and on one seed."""
    count = seeds if seeds is not None else (QUICK_SEEDS if quick else FULL_SEEDS)
    seed_list = [seed + k for k in range(count)]
    jobs = []
    for s in scenarios:
        sized = s.scaled(s.quick_requests) if quick else s
        jobs += [(sized, p, k) for p in policies for k in seed_list]
    return jobs


def execute(jobs: Sequence[Job], workers: int = 1,
            progress: Progress | None = None) -> list[RunMetrics]:
    """Run the jobs (in `workers` processes when > 1), reporting progress."""
    out: list[RunMetrics] = []
    if workers <= 1:
        for job in jobs:
            out.append(run_job(job))
            if progress:
                progress(len(out), len(jobs), f"{job[0].name} {job[1]}")
        return out
    with ProcessPoolExecutor(workers) as pool:
        for job, result in zip(jobs, pool.map(run_job, jobs), strict=True):
            out.append(result)
            if progress:
                progress(len(out), len(jobs), f"{job[0].name} {job[1]}")
    return out


Cells = dict[str, dict[str, Cell]]  # scenario -> policy -> cell


def summarize(jobs: Sequence[Job], results: Sequence[RunMetrics]) -> Cells:
    """Per scenario and policy, the runs of every seed averaged against the oracle's."""
    runs: dict[str, dict[str, dict[int, RunMetrics]]] = {}
    for (scenario, policy, seed), m in zip(jobs, results, strict=True):
        runs.setdefault(scenario.name, {}).setdefault(policy, {})[seed] = m
    return {name: {p: _cell(seeds, by_policy["oracle"]) for p, seeds in by_policy.items()}
            for name, by_policy in runs.items()}


def report(cells: Cells) -> dict[str, Any]:
    """The JSON report `{"scenarios": {scenario: {policy: {...}}}}`, the default policy
    repeated under "default"."""
    default = RouterConfig().policy
    out: dict[str, Any] = {}
    for name, by_policy in cells.items():
        doc = {p: c.to_json() for p, c in by_policy.items()}
        if default in doc:
            doc["default"] = dict(doc[default])
        out[name] = doc
    return {"scenarios": out}


def _cell(seeds: dict[int, RunMetrics], oracle: dict[int, RunMetrics]) -> Cell:
    fractions = [m.tokens_per_s / oracle[k].tokens_per_s for k, m in seeds.items()]
    reconv = [m.reconverge_requests for m in seeds.values()]
    finite = sorted(float("inf") if r is None else r for r in reconv)
    median = statistics.median(finite)
    return Cell(statistics.fmean(fractions),
                statistics.fmean(m.p95_latency_s for m in seeds.values()),
                statistics.fmean(m.failed_rate for m in seeds.values()),
                None if median == float("inf") else median,
                _standard_error(fractions))


def _standard_error(values: Sequence[float]) -> float:
    """Standard error of the mean (0 for a single value)."""
    if len(values) < 2:
        return 0.0
    return statistics.stdev(values) / math.sqrt(len(values))


def bar(stream: TextIO | None = None, width: int = 30) -> Progress:
    """A plain-text progress bar on `stream` (stderr); one line per tenth when not a tty."""
    out = stream or sys.stderr
    live = out.isatty()

    def show(done: int, total: int, label: str) -> None:
        filled = width * done // total
        line = f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {label:<40}"
        if live:
            out.write("\r" + line + ("\n" if done == total else ""))
        elif done == total or (10 * done // total) != (10 * (done - 1) // total):
            out.write(line.rstrip() + "\n")
        out.flush()
    return show


def markdown(cells: Cells) -> str:
    """The results as a markdown table, one row per (scenario, policy); the fraction of the
    oracle carries its standard error over seeds."""
    lines = ["| scenario | policy | fraction of oracle | p95 latency s | failed rate | "
             "re-converge requests |", "|---|---|---:|---:|---:|---:|"]
    for scenario, by_policy in cells.items():
        for policy, c in by_policy.items():
            rc = c.reconverge_requests
            lines.append(f"| {scenario} | {policy} | {c.fraction_of_oracle:.3f} "
                         f"± {c.fraction_se:.3f} | {c.p95_latency_s:.1f} | "
                         f"{c.failed_rate:.3f} | {'never' if rc is None else round(rc)} |")
    return "\n".join(lines)
