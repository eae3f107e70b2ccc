"""The peers' rules: epsilon-greedy, LiteLLM lowest latency, Petals, FreeLLMAPI scoring."""

from __future__ import annotations

import random

import pytest

from meshroute_middleware.core import Arm, NodeRecord, Outcome, RouteView
from meshroute_middleware.core.policies.epsilon_greedy import EpsilonGreedyPolicy
from meshroute_middleware.core.policies.freellmapi import ScorePolicy, speed_score, ttfb_score
from meshroute_middleware.core.policies.litellm import LowestLatencyPolicy
from meshroute_middleware.core.policies.petals import PetalsPolicy, advertised_seconds_per_token
from meshroute_middleware.core.routes import Hop, make_route

DRAWS = 4000
UNSAMPLED = RouteView(None, 0.0, None, 0.0, 0.0, 0, "unsampled", 0)


def arm(name: str, prior: float = 10.0, view: RouteView = UNSAMPLED) -> Arm:
    node = NodeRecord(name, "m", 0, 31, 32, f"http://{name}.test", prior)
    return Arm(make_route("m", [Hop(node, 0, 31)]), view)


def measured(name: str, tps: float, ok: float = 5.0, fail: float = 0.0,
             ttfb_s: float | None = None, prior: float = 10.0) -> Arm:
    return arm(name, prior, RouteView(tps, 5.0, ttfb_s, ok, fail, 5, "proven", 1))


def shares(policy: object, arms: list[Arm], seed: int = 1) -> list[float]:
    rng, counts = random.Random(seed), [0] * len(arms)
    for _ in range(DRAWS):
        counts[policy.choose(arms, 0.0, rng)[0]] += 1  # type: ignore[attr-defined]
    return [c / DRAWS for c in counts]


def test_epsilon_greedy_exploits_the_best_and_explores_uniformly() -> None:
    got = shares(EpsilonGreedyPolicy(0.1), [measured("a", 60.0), measured("b", 40.0),
                                            measured("c", 20.0)])
    # 0.9 + 0.1/3 on the best, 0.1/3 on each other; binomial sd <= 0.005 at 4,000: ±0.02.
    assert got == pytest.approx([0.9 + 0.1 / 3, 0.1 / 3, 0.1 / 3], abs=0.02)


def test_epsilon_greedy_cold_start_takes_the_best_prior() -> None:
    policy = EpsilonGreedyPolicy(0.0)
    assert policy.choose([arm("a", 5.0), arm("b", 9.0)], 0.0, random.Random(1)) == (
        1, "greedy-fallback")


def test_litellm_tries_untried_deployments_first_then_lowest_mean() -> None:
    policy = LowestLatencyPolicy()
    arms = [arm("a"), arm("b")]
    assert policy.choose(arms, 0.0, random.Random(1))[0] == 0
    policy.observe(arms[0].signature, Outcome(100, 2.0), 0.0)  # 0.02 s/token
    assert policy.choose(arms, 0.0, random.Random(1)) == (1, "scout")
    policy.observe(arms[1].signature, Outcome(100, 1.0), 0.0)  # 0.01 s/token
    assert policy.choose(arms, 0.0, random.Random(1)) == (1, "exploit")


def test_litellm_keeps_only_the_last_ten_and_counts_timeouts_only() -> None:
    policy = LowestLatencyPolicy()
    a, b = arm("a"), arm("b")
    policy.observe(b.signature, Outcome(100, 1.5), 0.0)  # 0.015 s/token
    for _ in range(10):
        policy.observe(a.signature, Outcome(100, 3.0), 0.0)  # slow history ...
    for _ in range(10):
        policy.observe(a.signature, Outcome(100, 1.0), 0.0)  # ... pushed out by fast samples
    assert policy.choose([a, b], 0.0, random.Random(1))[0] == 0
    policy.observe(a.signature, Outcome(error="http_5xx"), 0.0)  # not recorded
    assert policy.choose([a, b], 0.0, random.Random(1))[0] == 0
    policy.observe(a.signature, Outcome(error="timeout"), 0.0)  # 1000 s in the window
    assert policy.choose([a, b], 0.0, random.Random(1))[0] == 1


def test_petals_cost_sums_each_hops_share_of_advertised_throughput() -> None:
    gpu = NodeRecord("gpu", "m", 0, 21, 40, "http://gpu.test", 100.0)
    cpu = NodeRecord("cpu", "m", 0, 39, 40, "http://cpu.test", 10.0)
    hybrid = Arm(make_route("m", [Hop(gpu, 0, 21), Hop(cpu, 22, 39)]), UNSAMPLED)
    alone = Arm(make_route("m", [Hop(cpu, 0, 39)]), UNSAMPLED)
    assert advertised_seconds_per_token(hybrid) == pytest.approx(22 / 2200 + 18 / 400)
    assert advertised_seconds_per_token(alone) == pytest.approx(0.1)
    # Deterministic and deaf to measurements: the hybrid wins on paper whatever was seen.
    slow_seen = Arm(hybrid.route, RouteView(1.0, 9.0, None, 9.0, 0.0, 9, "proven", 1))
    assert PetalsPolicy().choose([alone, slow_seen], 0.0, random.Random(1)) == (
        1, "greedy-fallback")


def test_freellmapi_scores_follow_the_published_constants() -> None:
    assert ttfb_score(0.2) == 1.0 and ttfb_score(6.0) == 0.0
    assert ttfb_score(2.65) == pytest.approx(0.5)
    assert ttfb_score(None) == 0.6
    assert speed_score(arm("x")) == 0.6  # prior without data
    fast = measured("f", 60.0, ttfb_s=0.3)
    assert speed_score(fast) == pytest.approx(0.6 * (1 - 2.718281828 ** -1) + 0.4, rel=1e-6)


def test_freellmapi_prefers_the_reliable_route() -> None:
    got = shares(ScorePolicy(), [measured("flaky", 60.0, ok=30.0, fail=30.0),
                                 measured("steady", 50.0, ok=60.0, fail=0.0)])
    assert got[1] >= 0.99  # Beta(31,31) vs Beta(61,1): 0.5 vs 0.98 reliability
