"""Scoring axes and factors at the FreeLLMAPI seed's published constants, table-driven."""

from __future__ import annotations

import math
import random
import statistics

import pytest

from meshroute_middleware.core.providers import scoring as s
from meshroute_middleware.core.providers.scoring import OutcomeKind, RouteStats


@pytest.mark.parametrize(("ok", "fail", "mean"), [(0, 0, 0.5), (9, 0, 10 / 11), (0, 4, 1 / 6),
                                                  (3, 1, 4 / 6)])
def test_expected_reliability_is_the_beta_1_1_posterior_mean(ok: int, fail: int,
                                                              mean: float) -> None:
    assert s.expected_reliability(ok, fail) == pytest.approx(mean)


def test_thompson_draws_average_to_the_posterior_mean() -> None:
    rng = random.Random(7)
    draws = [s.sample_reliability(8, 2, rng) for _ in range(4000)]
    # Beta(9, 3): mean 0.75, sd 0.12; the mean of 4000 draws is within 4 standard errors.
    assert statistics.fmean(draws) == pytest.approx(0.75, abs=4 * 0.12 / math.sqrt(4000))
    assert min(draws) >= 0.0 and max(draws) <= 1.0
    assert statistics.pstdev(draws) > 0.05  # it explores


def test_the_same_seed_gives_the_same_draws() -> None:
    a = [s.sample_reliability(1, 1, random.Random(3)) for _ in range(3)]
    b = [s.sample_reliability(1, 1, random.Random(3)) for _ in range(3)]
    assert a == b


@pytest.mark.parametrize(("ttfb_ms", "score"), [(0, 1.0), (300, 1.0), (2650, 0.5), (5000, 0.0),
                                                (9000, 0.0)])
def test_ttfb_score_is_linear_between_300_and_5000_ms(ttfb_ms: float, score: float) -> None:
    assert s.ttfb_score(ttfb_ms) == pytest.approx(score)


@pytest.mark.parametrize(("tps", "ttfb_ms", "score"), [
    (None, None, 0.6),  # the prior
    (60.0, 300.0, 0.6 * (1 - math.exp(-1)) + 0.4),
    (0.0, 5000.0, 0.0),
    (1e9, 0.0, 1.0),
    (None, 300.0, 0.6 * 0.6 + 0.4),  # unmeasured throughput takes the prior's place
])
def test_speed_score(tps: float | None, ttfb_ms: float | None, score: float) -> None:
    assert s.speed_score(tps, ttfb_ms) == pytest.approx(score)


def test_intelligence_is_a_fixed_scale_by_tier() -> None:
    assert [s.intelligence_score(t) for t in ("frontier", "large", "medium", "small")] == [
        1.0, 0.75, 0.5, 0.25]


@pytest.mark.parametrize(("price_in", "price_out", "score"), [
    (0.0, 0.0, 1.0), (1.0, 1.0, 0.5), (0.5, 1.5, 1 / (1 + 0.75)), (3.0, 3.0, 0.25)])
def test_price_axis(price_in: float, price_out: float, score: float) -> None:
    assert s.price_score(price_in, price_out) == pytest.approx(score)


@pytest.mark.parametrize(("used", "budget", "factor"), [
    (0, None, 1.0), (0, 1000, 1.0), (800, 1000, 1.0), (900, 1000, 0.55), (1000, 1000, 0.1),
    (5000, 1000, 0.1)])
def test_headroom_factor(used: int, budget: int | None, factor: float) -> None:
    assert s.headroom_factor(used, budget) == pytest.approx(factor)


@pytest.mark.parametrize(("penalty", "factor"), [(0, 1.0), (5, 0.7), (10, 0.4), (30, 0.4)])
def test_rate_limit_factor(penalty: float, factor: float) -> None:
    assert s.rate_limit_factor(penalty) == pytest.approx(factor)


@pytest.mark.parametrize(("status", "kind"), [
    (200, OutcomeKind.SUCCESS), (429, OutcomeKind.RATE_LIMITED), (400, OutcomeKind.CLIENT_ERROR),
    (413, OutcomeKind.CLIENT_ERROR), (401, OutcomeKind.CLIENT_ERROR),
    (500, OutcomeKind.FAILURE), (503, OutcomeKind.FAILURE)])
def test_classify_status(status: int, kind: OutcomeKind) -> None:
    assert s.classify_status(status) is kind


def test_penalty_steps_cap_and_decay_one_point_per_two_minutes() -> None:
    st = RouteStats()
    for _ in range(4):
        st.record(OutcomeKind.RATE_LIMITED, 0.0)
    assert st.penalty_now(0.0) == 10.0  # 12 capped at 10
    assert st.penalty_now(120.0) == pytest.approx(9.0)
    assert st.penalty_now(1200.0) == 0.0
    st.record(OutcomeKind.FAILURE, 240.0)  # 8 + 1
    assert st.penalty_now(240.0) == pytest.approx(9.0)
    st.record(OutcomeKind.SUCCESS, 240.0)
    assert st.penalty_now(240.0) == pytest.approx(8.0)
    st.clear_penalty()
    assert st.penalty_now(240.0) == 0.0


def test_a_success_never_drives_the_penalty_below_zero() -> None:
    st = RouteStats()
    st.record(OutcomeKind.SUCCESS, 0.0)
    assert st.penalty_now(0.0) == 0.0


def test_a_client_error_counts_against_nobody() -> None:
    st = RouteStats()
    st.record(OutcomeKind.CLIENT_ERROR, 5.0, 100.0, 50.0)
    assert st == RouteStats()


def test_successes_feed_speed_and_failures_reliability() -> None:
    st = RouteStats()
    st.record(OutcomeKind.SUCCESS, 0.0, tokens_per_s=100.0, ttfb_ms=200.0)
    st.record(OutcomeKind.SUCCESS, 1.0, tokens_per_s=50.0, ttfb_ms=None)
    st.record(OutcomeKind.FAILURE, 2.0, tokens_per_s=1.0, ttfb_ms=9999.0)
    assert (st.ok, st.fail) == (2.0, 1.0)
    assert st.tokens_per_s == pytest.approx(100 + 0.2 * (50 - 100))
    assert st.ttfb_ms == pytest.approx(200.0)  # a failure's timing says nothing about speed


def test_counts_are_windowed_so_old_history_cannot_outvote_new() -> None:
    st = RouteStats()
    for _ in range(1000):
        st.record(OutcomeKind.SUCCESS, 0.0)
    for _ in range(100):
        st.record(OutcomeKind.FAILURE, 0.0)
    assert st.ok + st.fail == pytest.approx(s.RELIABILITY_WINDOW)
    assert s.expected_reliability(st.ok, st.fail) < 0.7  # not 1001/1102 = 0.91


def test_stats_round_trip_through_plain_data() -> None:
    st = RouteStats(3.0, 1.0, 42.0, None, 4.5, 99.0)
    assert RouteStats.from_dict(st.to_dict()) == st


@pytest.mark.parametrize(("strategy", "weights"), [
    ("balanced", (0.5, 0.25, 0.25)), ("fastest", (0.35, 0.55, 0.1)),
    ("reliable", (0.7, 0.15, 0.15)), ("smartest", (0.35, 0.1, 0.55))])
def test_presets_are_the_published_ones(strategy: str,
                                        weights: tuple[float, float, float]) -> None:
    w = s.STRATEGY_WEIGHTS[strategy]
    assert (w.reliability, w.speed, w.intelligence, w.price) == (*weights, 0.0)


def test_combine_is_the_convex_combination_times_the_factors() -> None:
    w = s.STRATEGY_WEIGHTS["balanced"]
    assert s.combine(w, 1.0, 0.6, 0.5, 0.0, 0.5, 0.8) == pytest.approx(
        (0.5 + 0.25 * 0.6 + 0.25 * 0.5) * 0.5 * 0.8)


def test_cheapest_puts_a_free_unreliable_route_above_a_reliable_paid_one() -> None:
    w = s.STRATEGY_WEIGHTS["cheapest"]
    free = s.combine(w, 0.0, 0.0, 0.25, s.price_score(0, 0), 1, 1)
    paid = s.combine(w, 1.0, 1.0, 1.0, s.price_score(1.0, 1.0), 1, 1)
    assert free > paid
    # …while, at the same price, reliability decides.
    assert s.combine(w, 0.9, 0.5, 0.5, 1.0, 1, 1) > s.combine(w, 0.3, 0.5, 0.5, 1.0, 1, 1)


@pytest.mark.parametrize(("alias", "strategy"), [
    ("fast", "fastest"), ("fastest", "fastest"), ("speed", "fastest"), ("smart", "smartest"),
    ("reliable", "reliable"), ("balanced", "balanced"), ("cheap", "cheapest")])
def test_auto_aliases(alias: str, strategy: str) -> None:
    assert s.AUTO_ALIASES[alias] == strategy
