"""Metrics of one run: delivered tokens/s, p95 latency, failed rate, re-convergence."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .workload import Request, Trace

WINDOW = 50  # decisions per re-convergence window
CONVERGED_SHARE = 0.8  # share of good decisions in a window that counts as converged


@dataclass(frozen=True, slots=True)
class RunMetrics:
    """What the benchmark reports of one (scenario, policy, seed) run."""

    tokens_per_s: float  # delivered (successful) tokens over the makespan
    p95_latency_s: float
    failed_rate: float
    reconverge_requests: float | None  # median over change points; None if never
    mean_ttft_s: float = 0.0  # arrival to first token, over the successful requests
    p95_ttft_s: float = 0.0
    warm_share: float = 0.0  # of the requests with a prompt, those that found half cached


def throughput(trace: Trace) -> float:
    """Delivered tokens/s from the first arrival to the last completion."""
    span = max(trace.finish_s) - min(trace.arrival_s)
    return sum(trace.tokens_ok) / span if span > 0 else 0.0


def p95(values: Sequence[float]) -> float:
    """The 95th percentile (linear interpolation, numpy's default)."""
    return float(np.percentile(np.asarray(values, dtype=float), 95))


def converge_after(good: Sequence[bool], start: int, stop: int,
                   window: int = WINDOW, share: float = CONVERGED_SHARE) -> int | None:
    """Decisions after `start` until the first window of `window` decisions, all before
    `stop`, of which at least `share` were good; None if no such window."""
    need = math.ceil(share * window)
    if stop - start < window:
        return None
    flags = np.asarray(good[start:stop], dtype=np.int32)
    sums = np.convolve(flags, np.ones(window, dtype=np.int32), mode="valid")
    hits = np.nonzero(sums >= need)[0]
    return int(hits[0]) if hits.size else None


def reconverge(good: Sequence[bool], change_points: Sequence[int]) -> float | None:
    """Median over change points of `converge_after` (never = infinitely long)."""
    bounds = [*change_points, len(good)]
    results = [converge_after(good, a, b) for a, b in itertools.pairwise(bounds)]
    values = sorted(math.inf if r is None else float(r) for r in results)
    median = statistics.median(values)
    return None if math.isinf(median) else median


def measure(trace: Trace, change_points: Sequence[int]) -> RunMetrics:
    """All metrics of one run."""
    latencies = [f - a for a, f in zip(trace.arrival_s, trace.finish_s, strict=True)]
    failed = sum(trace.failed) / len(trace.failed)
    # (a trace built by hand may carry no first-token times)
    ttft = [t for t, f in zip(trace.ttft_s, trace.failed, strict=False) if not f] or [0.0]
    return RunMetrics(throughput(trace), p95(latencies), failed,
                      reconverge(trace.good, change_points), statistics.fmean(ttft), p95(ttft),
                      sum(trace.warm) / len(trace.warm) if trace.warm else 0.0)


def route_share(requests: Sequence[Request], nodes: tuple[str, ...], start_s: float,
                end_s: float) -> float | None:
    """Share of the requests that arrived in [start_s, end_s) which took the route through
    `nodes` (None when none arrived)."""
    sent = [r.nodes == nodes for r in requests if start_s <= r.arrival_s < end_s]
    return sum(sent) / len(sent) if sent else None


def falls_below(requests: Sequence[Request], nodes: tuple[str, ...], after_s: float,
                level: float, window_s: float = 2.0, min_requests: int = 5) -> float | None:
    """Seconds after `after_s` until the route's share of the requests that arrived in the
    trailing `window_s` (only those after `after_s`, at least `min_requests` of them) first
    falls below `level`; None if it never does."""
    times = sorted((r.arrival_s, r.nodes == nodes) for r in requests if r.arrival_s >= after_s)
    lo, took = 0, 0
    for hi, (t, on_route) in enumerate(times):
        took += on_route
        while times[lo][0] <= t - window_s:
            took -= times[lo][1]
            lo += 1
        count = hi - lo + 1
        if count >= min_requests and took / count < level:
            return t - after_s
    return None
