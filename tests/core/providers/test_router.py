"""The provider router facade: ranking, pinning, sessions, key taking, recording, views."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from meshroute_middleware.core.errors import InvalidPinError
from meshroute_middleware.core.providers.chain import Candidate
from meshroute_middleware.core.providers.config import ProvidersConfig, parse_providers_config
from meshroute_middleware.core.providers.exhaustion import PassedOver
from meshroute_middleware.core.providers.keys import COOLDOWN_LADDER_S
from meshroute_middleware.core.providers.router import (
    ChainAttempt,
    ProviderRouter,
    StateRestoreError,
)
from meshroute_middleware.core.providers.scoring import OutcomeKind

from .conftest import MESH, T0, doc


def routes(ranked: list) -> list[str]:  # type: ignore[type-arg]
    return [s.candidate.route for s in ranked]


def candidate(router: ProviderRouter, route: str) -> Candidate:
    return router.resolve(route, MESH).candidates[0]


def serve(router: ProviderRouter, route: str, now: float, kind: OutcomeKind, **kw: object) -> (
        PassedOver | None):
    got = router.acquire(candidate(router, route), 100, now)
    assert isinstance(got, ChainAttempt), got
    return router.record(got, kind, now, **kw)  # type: ignore[arg-type]


def warm(router: ProviderRouter, now: float) -> None:
    """qwen fast and sure; big-model slower, fails 1 in 10; huge-model slow; small-model flaky."""
    for i in range(30):
        t = now + i
        serve(router, "qwen", t, OutcomeKind.SUCCESS, tokens_per_s=150.0, ttfb_ms=200.0)
        serve(router, "fastco/big-model", t,
              OutcomeKind.FAILURE if i % 10 == 0 else OutcomeKind.SUCCESS, reason="timeout",
              tokens_per_s=60.0, ttfb_ms=800.0, used_tokens=50)
        serve(router, "fastco/huge-model", t, OutcomeKind.SUCCESS, tokens_per_s=15.0,
              ttfb_ms=2500.0, used_tokens=50)
        serve(router, "slowco/small-model", t,
              OutcomeKind.SUCCESS if i % 2 else OutcomeKind.FAILURE, reason="http_5xx",
              tokens_per_s=80.0, ttfb_ms=400.0, used_tokens=50)


@pytest.mark.parametrize(("model", "first", "last"), [
    ("auto:fast", "qwen", "fastco/huge-model"),
    ("auto:smart", "fastco/huge-model", "slowco/small-model"),
    ("auto:reliable", "qwen", "slowco/small-model"),
    ("auto:cheap", "qwen", "fastco/huge-model"),
])
def test_auto_ordering_after_warm_up(cfg: ProvidersConfig, model: str, first: str,
                                     last: str) -> None:
    router = ProviderRouter(cfg)
    warm(router, T0)
    now = T0 + 1000  # rate-limit penalties have decayed
    res = router.resolve(model, {"qwen"})
    shown = routes(router.rank(res, now))
    assert (shown[0], shown[-1]) == (first, last), shown
    # Thompson draws agree with the expectation on the head most of the time (seeded).
    rng = random.Random(1)
    heads = [routes(router.rank(res, now, rng))[0] for _ in range(200)]
    assert heads.count(first) / len(heads) > 0.6


def test_cheap_puts_free_routes_before_paid_ones(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    shown = routes(router.rank(router.resolve("auto:cheap", MESH), T0))
    paid = {"fastco/big-model", "fastco/huge-model"}
    assert set(shown[-2:]) == paid
    assert shown[-1] == "fastco/huge-model"  # $3/$15 is dearer than $0.5/$1.5


def test_a_mesh_route_is_scored_on_the_same_axes(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    qwen = router.score(candidate(router, "qwen"), "balanced", T0)
    assert (qwen.price, qwen.intelligence, qwen.headroom, qwen.speed) == (1.0, 0.5, 1.0, 0.6)
    big = router.score(candidate(router, "fastco/big-model"), "balanced", T0)
    assert big.intelligence == 0.75 and big.price == pytest.approx(1 / 1.75)


def test_adding_a_model_moves_no_other_score(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    before = {s.candidate.route: s.score for s in router.rank(router.resolve("auto", MESH), T0)}
    after = {s.candidate.route: s.score
             for s in router.rank(router.resolve("auto:balanced", MESH), T0)}
    for route, score in before.items():
        assert after[route] == score


def test_thompson_ranking_is_reproducible_with_a_seed(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    res = router.resolve("auto:balanced", MESH)
    a = [routes(router.rank(res, T0, random.Random(5))) for _ in range(3)]
    b = [routes(router.rank(res, T0, random.Random(5))) for _ in range(3)]
    assert a == b


def test_a_pinned_route_goes_first_and_still_passes_the_key_gates(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    res = router.resolve("auto", MESH)
    ranked = router.rank(res, T0, pinned="fastco/big-model")
    assert routes(ranked)[0] == "fastco/big-model"
    for key in (1, 2):
        router.gates.rate_limited("fastco/big-model", key, 30.0, T0)
    got = router.acquire(ranked[0].candidate, 10, T0 + 1)
    assert got == [PassedOver("fastco/big-model#1", "cooldown", T0 + 30),
                   PassedOver("fastco/big-model#2", "cooldown", T0 + 30)]


def test_a_pin_outside_the_chain(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    res = router.resolve("auto", MESH)
    assert routes(router.rank(res, T0, pinned="fastco/huge-model"))[0] == "fastco/huge-model"
    with pytest.raises(InvalidPinError):
        router.rank(res, T0, pinned="qwen")  # a mesh model not in this chain
    with pytest.raises(InvalidPinError):
        router.rank(res, T0, pinned="fastco/nope")


def test_a_session_sticks_to_its_route_while_it_stays_usable(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    res = router.resolve("auto:balanced", MESH)
    sticky = "slowco/small-model"
    assert routes(router.rank(res, T0))[0] != sticky
    serve(router, sticky, T0, OutcomeKind.SUCCESS, session="s1")
    assert routes(router.rank(res, T0 + 1, session="s1"))[0] == sticky
    assert routes(router.rank(res, T0 + 1, session="other"))[0] != sticky
    router.gates.rate_limited(sticky, 1, 60.0, T0 + 1)  # its only key is cooling down
    assert routes(router.rank(res, T0 + 2, session="s1"))[0] != sticky
    assert routes(router.rank(res, T0 + 62, session="s1"))[0] == sticky  # usable again
    # A pin goes in front of the session's route.
    assert routes(router.rank(res, T0 + 62, session="s1", pinned="qwen"))[:2] == [
        "qwen", sticky]


def test_acquire_round_robins_keys_and_passes_mesh_routes_through(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    big = candidate(router, "fastco/big-model")
    attempts = [router.acquire(big, 10, T0) for _ in range(3)]
    assert [a.route for a in attempts if isinstance(a, ChainAttempt)] == [
        "fastco/big-model#1", "fastco/big-model#2", "fastco/big-model#1"]
    qwen = router.acquire(candidate(router, "qwen"), 10, T0)
    assert qwen == ChainAttempt(candidate(router, "qwen")) and qwen.route == "qwen"


def test_a_request_over_the_context_is_passed_over(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    got = router.acquire(candidate(router, "slowco/small-model"), 9000, T0)
    assert got == [PassedOver("slowco/small-model", "context")]


def test_record_a_429_cools_the_key_and_penalises_the_route(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    over = serve(router, "fastco/big-model", T0, OutcomeKind.RATE_LIMITED, retry_after_s=12.0)
    assert over == PassedOver("fastco/big-model#1", "http_429", T0 + 12)
    over = serve(router, "fastco/big-model", T0, OutcomeKind.RATE_LIMITED)
    assert over == PassedOver("fastco/big-model#2", "http_429", T0 + COOLDOWN_LADDER_S[0])
    assert router.stats["fastco/big-model"].penalty_now(T0) == 6.0
    assert router.score(candidate(router, "fastco/big-model"), "balanced",
                        T0).rate_limit == pytest.approx(1 - 0.6 * 6 / 10)
    assert router.clear("fastco/big-model") == 2
    assert router.stats["fastco/big-model"].penalty_now(T0) == 0.0
    assert isinstance(router.acquire(candidate(router, "fastco/big-model"), 1, T0), ChainAttempt)


@pytest.mark.parametrize("reason", ["http_5xx", "timeout", "connect"])
def test_record_a_failure(cfg: ProvidersConfig, reason: str) -> None:
    router = ProviderRouter(cfg)
    over = serve(router, "fastco/big-model", T0, OutcomeKind.FAILURE, reason=reason)
    assert over == PassedOver("fastco/big-model#1", reason)
    assert router.stats["fastco/big-model"].fail == 1.0


def test_a_client_error_counts_against_nobody(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    assert serve(router, "fastco/big-model", T0, OutcomeKind.CLIENT_ERROR) is None
    over = serve(router, "fastco/big-model", T0, OutcomeKind.CLIENT_ERROR, reason="context")
    assert over == PassedOver("fastco/big-model#2", "context")
    st = router.stats["fastco/big-model"]
    assert (st.ok, st.fail, st.penalty) == (0.0, 0.0, 0.0)


def test_success_settles_usage_into_the_monthly_headroom(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    big = candidate(router, "fastco/big-model")
    for key_tokens in (4_600_000, 4_600_000):  # both keys above 80 % of 5M
        got = router.acquire(big, 10, T0)
        assert isinstance(got, ChainAttempt)
        router.record(got, OutcomeKind.SUCCESS, T0, used_tokens=key_tokens)
    headroom = router.score(big, "balanced", T0).headroom
    assert headroom == pytest.approx(0.1 + 0.9 * 0.08 / 0.2)


def test_the_chain_view(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    router.gates.rate_limited("fastco/big-model", 2, 40.0, T0)
    view = router.chain_view(router.resolve("auto", MESH), T0)
    assert view["model"] == "auto" and view["strategy"] == "balanced"
    assert [e["route"] for e in view["chain"]] == ["fastco/big-model", "slowco/small-model"]
    big = view["chain"][0]
    assert set(big) == {"route", "kind", "position", "score", "reliability", "speed",
                        "intelligence", "price", "headroom", "rate_limit", "keys"}
    assert big["keys"] == [
        {"key": 1, "state": "ready", "until": None, "reason": None, "limits": "local"},
        {"key": 2, "state": "cooldown", "until": T0 + 40, "reason": "cooldown",
         "limits": "local"}]
    assert big["reliability"] == 0.5  # the expectation, not a draw
    text = json.dumps(view)
    assert "FASTCO_KEY" not in text and "env:" not in text
    mesh = router.chain_view(router.resolve("qwen", MESH), T0)["chain"][0]
    assert mesh["kind"] == "mesh" and mesh["keys"] == []


def test_snapshot_and_restore_carry_stats_and_gates(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    warm(router, T0)
    router.gates.rate_limited("fastco/big-model", 1, 300.0, T0 + 40)
    snap = router.snapshot(T0 + 41)
    again = ProviderRouter(cfg)
    again.restore(json.loads(json.dumps(snap)))
    assert again.stats == router.stats
    assert again.chain_view(again.resolve("auto:fast", MESH), T0 + 41) == router.chain_view(
        router.resolve("auto:fast", MESH), T0 + 41)


def test_changed_only_snapshots_carry_just_the_rows_an_attempt_touched(
        cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    warm(router, T0)
    router.snapshot(T0 + 30)  # everything so far is written
    assert router.snapshot(T0 + 30, changed_only=True) == {"windows": [], "keys": [],
                                                           "stats": []}
    serve(router, "fastco/big-model", T0 + 31, OutcomeKind.SUCCESS, used_tokens=7)
    rows = router.snapshot(T0 + 31, changed_only=True)
    assert [(r["name"], r["key"]) for r in rows["windows"]] == [("fastco", 1)]
    assert [(r["name"], r["key"]) for r in rows["keys"]] == [("fastco/big-model", 1)]
    assert [r["name"] for r in rows["stats"]] == ["fastco/big-model"]
    router.clear("fastco/big-model")
    assert [r["name"] for r in router.snapshot(T0 + 31, changed_only=True)["stats"]] == [
        "fastco/big-model"]


def test_clear_one_key_of_a_route(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    for key in (1, 2):
        router.gates.rate_limited("fastco/big-model", key, 100.0, T0)
    serve(router, "slowco/small-model", T0, OutcomeKind.RATE_LIMITED)
    assert router.clear("fastco/big-model#2") == 1
    view = router.chain_view(router.resolve("fastco/big-model", MESH), T0 + 1)
    assert [k["state"] for k in view["chain"][0]["keys"]] == ["cooldown", "ready"]
    assert router.stats["slowco/small-model"].penalty_now(T0) == 3.0
    assert router.clear() == 2
    assert router.stats["slowco/small-model"].penalty_now(T0) == 0.0


@pytest.mark.parametrize(("route", "known"), [
    ("fastco/big-model", True), ("fastco/big-model#2", True), ("fastco/big-model#3", False),
    ("fastco/big-model#0", False), ("fastco/nope", False), ("qwen", False),
    ("qwen#1", False)])
def test_knows_route(cfg: ProvidersConfig, route: str, known: bool) -> None:
    assert ProviderRouter(cfg).knows_route(route) is known


def _router_with(routing: dict[str, object]) -> ProviderRouter:
    d = doc()
    d["routing"].update(routing)
    return ProviderRouter(parse_providers_config(d))


@pytest.mark.parametrize(("attempts", "elapsed", "allowed"), [
    (0, 0.0, True), (2, 5.0, True), (3, 5.0, False), (0, 10.0, False), (1, 9.99, True)])
def test_attempt_and_time_budget(attempts: int, elapsed: float, allowed: bool) -> None:
    router = _router_with({"max_attempts": 3, "total_budget_s": 10.0})
    assert router.may_attempt(attempts, T0, T0 + elapsed) is allowed
    assert router.time_left(T0, T0 + elapsed) == pytest.approx(max(0.0, 10.0 - elapsed))


@pytest.mark.parametrize(("wait_for_key_s", "resets", "expected"), [
    (0.0, [T0 + 2], None),  # not configured: fail at once
    (5.0, [T0 + 2, T0 + 30], 2.0),  # the soonest frees within 5 s
    (5.0, [T0 + 30], None),  # too far
    (5.0, [], None),  # no reset known
    (50.0, [T0 + 30], 30.0),
])
def test_wait_for_key(wait_for_key_s: float, resets: list[float],
                      expected: float | None) -> None:
    router = _router_with({"wait_for_key_s": wait_for_key_s, "total_budget_s": 40.0})
    passed = [PassedOver(f"fastco/big-model#{i + 1}", "rpm", at) for i, at in enumerate(resets)]
    passed.append(PassedOver("slowco/small-model#1", "http_5xx"))
    assert router.wait_for_key(passed, T0, T0) == expected
    assert router.wait_for_key(passed, T0 - 39, T0) is None  # 1 s of the budget is left


@pytest.mark.parametrize("rows", [
    {"windows": [{"name": "fastco", "key": 1}]},
    {"keys": [{"name": "fastco/big-model", "key": "x"}]},
    {"stats": [{"key": 0}]},
])
def test_malformed_state_is_a_clear_error(cfg: ProvidersConfig,
                                          rows: dict[str, list[dict[str, Any]]]) -> None:
    with pytest.raises(StateRestoreError, match="malformed provider state row"):
        ProviderRouter(cfg).restore(rows)


@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_key_leaves_rotation_and_blames_not_the_route(cfg: ProvidersConfig,
                                                                 status: int) -> None:
    router = ProviderRouter(cfg)
    big = candidate(router, "fastco/big-model")
    got = router.acquire(big, 100, T0)
    assert isinstance(got, ChainAttempt) and got.key == 1
    assert router.key_refused(got, status, T0) == PassedOver("fastco/big-model#1",
                                                             f"http_{status}")
    assert "fastco/big-model" not in router.stats  # no failure of the route
    for _ in range(3):  # the next requests take key 2 only
        again = router.acquire(big, 100, T0 + 1)
        assert isinstance(again, ChainAttempt) and again.key == 2
    keys = router.chain_view(router.resolve("fastco/big-model", MESH), T0)["chain"][0]["keys"]
    assert keys[0] == {"key": 1, "state": "revoked", "until": None, "reason": f"http_{status}",
                       "limits": "local"}
    huge = router.acquire(candidate(router, "fastco/huge-model"), 100, T0)
    assert isinstance(huge, ChainAttempt) and huge.key == (2 if status == 401 else 1)
    assert router.clear("fastco/big-model#1") == 1
    back = [router.acquire(big, 100, T0 + 2) for _ in range(2)]
    assert {a.key for a in back if isinstance(a, ChainAttempt)} == {1, 2}


def test_under_fastest_an_untried_faster_provider_is_learned(cfg: ProvidersConfig) -> None:
    """Issue 26: a measured mesh route (50 tok/s) beside an untried provider model that is
    in truth twice as fast. With the speed a fixed prior 0.6 the provider could never outscore
    the mesh route's measured 0.72; drawn from a posterior it is tried, learned, and takes
    most of the traffic within 50 requests. The chain view still shows expected values."""
    router = ProviderRouter(cfg)
    truth = {"qwen": (50.0, 500.0), "fastco/big-model": (100.0, 250.0)}
    for i in range(30):
        serve(router, "qwen", T0 + i, OutcomeKind.SUCCESS, tokens_per_s=50.0, ttfb_ms=500.0)
    res = router.resolve("auto:mesh-first", MESH)
    assert res.strategy == "fastest"
    shown = {s.candidate.route: s.speed for s in router.rank(res, T0 + 30)}
    assert shown["fastco/big-model"] == 0.6 and shown["qwen"] > 0.7
    rng = random.Random(3)
    chosen = []
    for k in range(50):
        now = T0 + 40 + k
        first = router.rank(res, now, rng)[0].candidate.route
        chosen.append(first)
        tps, ttfb = truth[first]
        serve(router, first, now, OutcomeKind.SUCCESS, tokens_per_s=tps, ttfb_ms=ttfb,
              used_tokens=50)
    assert chosen[25:].count("fastco/big-model") >= 18
