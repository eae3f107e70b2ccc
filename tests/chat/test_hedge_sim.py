"""The simulator's reliability scenarios (core/sim/reliability.py) score hedging, learned
deadlines and continuation as the gateway does them: seeded, no clock, exact."""

from __future__ import annotations

from dataclasses import replace

from meshroute_middleware.core.sim import POLICIES, RELIABILITY_SCENARIOS, run_reliability

SCENARIOS = {s.name: replace(s, requests=1000) for s in RELIABILITY_SCENARIOS}
POLICY = {p.name: p for p in POLICIES}


def score(scenario: str, policy: str, seed: int = 1) -> dict[str, float]:
    return run_reliability(SCENARIOS[scenario], POLICY[policy], seed).summary()


def test_hedging_cuts_issue_34s_tail_within_its_cap() -> None:
    plain = score("r3-issue-34", "learned deadlines")
    hedged = score("r3-issue-34", "learned + hedge p95, cap 15 %")
    assert plain["p99_ttft_s"] > 1.0  # one in 25 waits its 2 s
    assert hedged["p99_ttft_s"] < 0.5 and hedged["mean_ttft_s"] < plain["mean_ttft_s"]
    assert hedged["hedges"] <= 0.15 and hedged["extra_upstream"] < 0.15
    capped = score("r3-issue-34", "learned + hedge p95")
    assert capped["hedges"] <= 0.05 + 2 / 1000  # the default cap (and its burst of 2)


def test_continuing_a_broken_stream_delivers_what_erroring_loses() -> None:
    erroring = score("r2-dying", "learned deadlines")
    continued = score("r2-dying", "learned + continue")
    retried = score("r2-dying", "timeouts only (peers)")
    assert erroring["whole"] < 0.9 < continued["whole"]
    assert continued["delivered_tps"] > retried["delivered_tps"]  # no word made twice
    assert retried["delivered_tps"] < erroring["delivered_tps"]  # 30 s silences cost


def test_runs_are_seeded() -> None:
    assert score("r1-slow-tail", "learned + hedge p95", 3) == \
        score("r1-slow-tail", "learned + hedge p95", 3)
