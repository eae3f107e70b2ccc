"""Re-convergence, throughput and percentile definitions."""

from __future__ import annotations

import pytest

from meshroute_middleware.core.sim.metrics import converge_after, measure, p95, reconverge
from meshroute_middleware.core.sim.workload import Trace


def test_converge_after_finds_the_first_window_with_enough_good_decisions() -> None:
    good = [False] * 30 + [True] * 100
    # The window starting at 20 holds 10 bad then 40 good: exactly 80 %.
    assert converge_after(good, 0, len(good)) == 20


def test_converge_after_is_none_without_a_whole_window() -> None:
    assert converge_after([True] * 49, 0, 49) is None
    assert converge_after([True, False] * 100, 0, 200) is None  # 50 % never reaches 80 %


def test_reconverge_is_the_median_over_change_points() -> None:
    good = [True] * 100 + [False] * 20 + [True] * 80 + [False] * 200
    # Segments: [0,100) converges at 0, [100,200) at 10 (10 bad + 40 good), [200,400)
    # never: median 10.
    assert reconverge(good, [0, 100, 200]) == 10
    assert reconverge(good, [0, 200]) is None  # median of (0, never) is never


def test_measure_counts_delivered_tokens_over_the_makespan() -> None:
    trace = Trace([0.0, 1.0], [2.0, 4.0], [100, 0], [False, True], [True, True])
    m = measure(trace, [0])
    assert m.tokens_per_s == pytest.approx(25.0)
    assert m.failed_rate == 0.5
    assert m.p95_latency_s == pytest.approx(p95([2.0, 3.0]))
