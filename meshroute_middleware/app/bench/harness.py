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
from meshroute_middleware.core.sim.oracle import FIXED_SPLIT
from meshroute_middleware.core.sim.scenarios import MESH_SCENARIOS, SCENARIOS

POLICIES = ("oracle", "thompson", "adr0021", "epsilon-greedy", "litellm-latency", "petals",
            "freellmapi")
# Issue 26: on conversations, today's thompson (blind to prompts) and the rules of
# self-hosted routers beside the default policy.
CONVERSATION_POLICIES = ("oracle", "thompson", "thompson-blind", "session-sticky",
                         "least-loaded", "sglang-cache", "litellm-latency")
# Issue 31: slot-limited meshes and several trackers, against the best fixed split too.
MESH_POLICIES = ("oracle", FIXED_SPLIT, "thompson", "least-loaded", "litellm-latency")
MESH_NAMES = frozenset(s.name for s in MESH_SCENARIOS)
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
    conversation: ConversationCell | None = None  # conversation scenarios only (issue 26)

    def to_json(self) -> dict[str, Any]:
        """The JSON object of issue 6 (and issue 26's time to first token on conversations)."""
        doc: dict[str, Any] = {
            "fraction_of_oracle": round(self.fraction_of_oracle, 4),
            "p95_latency_s": round(self.p95_latency_s, 3),
            "failed_rate": round(self.failed_rate, 4),
            "reconverge_requests": (None if self.reconverge_requests is None
                                    else round(self.reconverge_requests))}
        c = self.conversation
        if c is not None:
            doc.update({"tokens_per_s": round(c.tokens_per_s, 2),
                        "mean_ttft_s": round(c.mean_ttft_s, 4),
                        "ttft_of_oracle": round(c.ttft_of_oracle, 4),
                        "p95_ttft_s": round(c.p95_ttft_s, 4),
                        "warm_share": round(c.warm_share, 4)})
        return doc


@dataclass(frozen=True, slots=True)
class ConversationCell:
    """Issue 26's figures of one (conversation scenario, policy), averaged over seeds."""

    tokens_per_s: float
    mean_ttft_s: float
    ttft_of_oracle: float  # mean over seeds of this run's mean TTFT / the oracle's
    p95_ttft_s: float
    warm_share: float


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
        names = policies
        mesh = s.name in MESH_NAMES
        if policies is POLICIES:
            if s.conversations is not None:
                names = CONVERSATION_POLICIES
            elif mesh:
                names = MESH_POLICIES
        if mesh and FIXED_SPLIT not in names:
            names = (*names, FIXED_SPLIT)
        jobs += [(sized, p, k) for p in names for k in seed_list]
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
    conversing: set[str] = set()
    for (scenario, policy, seed), m in zip(jobs, results, strict=True):
        runs.setdefault(scenario.name, {}).setdefault(policy, {})[seed] = m
        if scenario.conversations is not None:
            conversing.add(scenario.name)
    return {name: {p: _cell(seeds, by_policy["oracle"], name in conversing)
                   for p, seeds in by_policy.items()}
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


def _cell(seeds: dict[int, RunMetrics], oracle: dict[int, RunMetrics],
          conversing: bool = False) -> Cell:
    fractions = [m.tokens_per_s / oracle[k].tokens_per_s for k, m in seeds.items()]
    reconv = [m.reconverge_requests for m in seeds.values()]
    finite = sorted(float("inf") if r is None else r for r in reconv)
    median = statistics.median(finite)
    conversation = None
    if conversing:
        ms = list(seeds.values())
        conversation = ConversationCell(
            statistics.fmean(m.tokens_per_s for m in ms),
            statistics.fmean(m.mean_ttft_s for m in ms),
            statistics.fmean(m.mean_ttft_s / max(oracle[k].mean_ttft_s, 1e-9)
                             for k, m in seeds.items()),
            statistics.fmean(m.p95_ttft_s for m in ms),
            statistics.fmean(m.warm_share for m in ms))
    return Cell(statistics.fmean(fractions),
                statistics.fmean(m.p95_latency_s for m in seeds.values()),
                statistics.fmean(m.failed_rate for m in seeds.values()),
                None if median == float("inf") else median,
                _standard_error(fractions), conversation)


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
    talks = {s: b for s, b in cells.items() if any(c.conversation for c in b.values())}
    for scenario, by_policy in cells.items():
        if scenario in talks:
            continue
        for policy, c in by_policy.items():
            rc = c.reconverge_requests
            lines.append(f"| {scenario} | {policy} | {c.fraction_of_oracle:.3f} "
                         f"± {c.fraction_se:.3f} | {c.p95_latency_s:.1f} | "
                         f"{c.failed_rate:.3f} | {'never' if rc is None else round(rc)} |")
    splits = [(s, b) for s, b in cells.items() if FIXED_SPLIT in b]
    if splits:  # issue 31: each policy against the best fixed split of the same runs
        lines += ["", "| scenario | policy | fraction of the best fixed split |", "|---|---|---:|"]
        for scenario, by_policy in splits:
            base = by_policy[FIXED_SPLIT].fraction_of_oracle
            lines += [f"| {scenario} | {policy} | {c.fraction_of_oracle / base:.3f} |"
                      for policy, c in by_policy.items() if policy != FIXED_SPLIT]
    if talks:  # the conversation scenarios' own table, after the others' if any
        table = conversation_table(talks)
        lines = [*lines, "", *table] if len(lines) > 2 else table
    return "\n".join(lines)


def conversation_table(cells: Cells) -> list[str]:
    """Issue 26's table of the conversation scenarios: delivered tokens/s against the
    oracle's, and time to first token (mean, against the oracle's, p95)."""
    lines = ["| scenario | policy | fraction of oracle | tokens/s | mean TTFT s | "
             "TTFT / oracle | p95 TTFT s | warm turns | failed rate |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for scenario, by_policy in cells.items():
        for policy, c in by_policy.items():
            v = c.conversation
            assert v is not None
            lines.append(f"| {scenario} | {policy} | {c.fraction_of_oracle:.3f} "
                         f"± {c.fraction_se:.3f} | {v.tokens_per_s:.1f} | "
                         f"{v.mean_ttft_s:.3f} | {v.ttft_of_oracle:.3f} | "
                         f"{v.p95_ttft_s:.2f} | {v.warm_share:.2f} | {c.failed_rate:.3f} |")
    return lines
