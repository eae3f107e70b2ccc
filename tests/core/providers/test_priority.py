"""`strategy = "priority"` (issue 24): the chain's written order, each route passed over while
it cannot be used, outcomes still recorded; `score: null` and `position` in the chain view."""

from __future__ import annotations

import random
from typing import Any

import pytest

from meshroute_middleware.core.providers.config import (
    ProviderConfigError,
    ProvidersConfig,
    parse_providers_config,
)
from meshroute_middleware.core.providers.router import ChainAttempt, ProviderRouter
from meshroute_middleware.core.providers.scoring import OutcomeKind

from .conftest import MESH, T0, doc

WRITTEN = ["slowco/small-model", "fastco/big-model", "qwen"]


def priority_doc(**profile: Any) -> dict[str, Any]:
    d = doc()
    d["routing"].update(strategy="priority", chain=WRITTEN)
    del d["routing"]["profile"]
    d["profiles"]["ordered"] = {"chain": ["qwen", "fastco/huge-model"], **profile}
    return d


@pytest.fixture
def router() -> ProviderRouter:
    return ProviderRouter(parse_providers_config(priority_doc()))


def order(router: ProviderRouter, model: str = "auto", now: float = T0, **kw: Any) -> list[str]:
    res = router.resolve(model, MESH)
    return [s.candidate.route for s in router.rank(res, now, random.Random(1), **kw)]


def serve(router: ProviderRouter, model: str, now: float,
          answers: dict[str, OutcomeKind]) -> str | None:
    """The chain loop in miniature: the route key that served, or None when exhausted."""
    res = router.resolve(model, MESH)
    for scored in router.rank(res, now, random.Random(0), tokens=10):
        got = router.acquire(scored.candidate, 10, now)
        if isinstance(got, list):
            continue  # passed over: gates, cooldown, context
        kind = answers.get(scored.candidate.route, OutcomeKind.SUCCESS)
        over = router.record(got, kind, now, reason="http_5xx", retry_after_s=60.0,
                             tokens_per_s=50.0, ttfb_ms=300.0)
        if over is None:
            return got.route
    return None


def test_priority_is_a_strategy_of_routing_and_of_profiles() -> None:
    cfg = parse_providers_config(priority_doc(strategy="priority"))
    assert cfg.routing.strategy == "priority"
    ordered = cfg.profile("ordered")
    assert ordered is not None and ordered.strategy == "priority"
    bad = priority_doc()
    bad["profiles"]["priority"] = {"chain": ["qwen"]}
    with pytest.raises(ProviderConfigError, match="auto:priority"):
        parse_providers_config(bad)  # `auto:priority` names the strategy


def test_the_written_order_holds_whatever_the_statistics(router: ProviderRouter) -> None:
    # the first route fails half the time and is slow, the last is fast and sure: every
    # scoring strategy would put qwen first, priority keeps the written order
    for i in range(40):
        t = T0 + i
        serve(router, "slowco/small-model", t, {"slowco/small-model": (
            OutcomeKind.FAILURE if i % 2 else OutcomeKind.SUCCESS)})
        serve(router, "qwen", t, {})
    assert order(router, now=T0 + 50) == WRITTEN
    balanced = ProviderRouter(parse_providers_config({**priority_doc(), "routing": {
        "chain": WRITTEN}}))
    balanced.stats = router.stats
    assert order(balanced, now=T0 + 50)[0] == "qwen"  # the same statistics, ranked by score
    assert all(s.score is None for s in router.rank(router.resolve("auto", MESH), T0 + 50))


def test_outcomes_are_still_recorded(router: ProviderRouter) -> None:
    for i in range(10):
        serve(router, "auto", T0 + i, {"slowco/small-model": OutcomeKind.FAILURE})
    small, big = router.stats["slowco/small-model"], router.stats["fastco/big-model"]
    assert small.fail > 0 and small.ok == 0  # measured on every request it was sent
    assert big.ok > 0 and big.tokens_per_s == pytest.approx(50.0)
    view = router.chain_view(router.resolve("auto", MESH), T0 + 10)
    rel = {r["route"]: r["reliability"] for r in view["chain"]}
    assert rel["slowco/small-model"] < 0.5 < rel["fastco/big-model"]


def test_a_cooled_down_route_is_skipped_then_first_again(router: ProviderRouter) -> None:
    assert serve(router, "auto", T0, {}) == "slowco/small-model#1"
    # its only key answers 429 (Retry-After 60 s): the next written route serves meanwhile
    assert serve(router, "auto", T0 + 1, {"slowco/small-model": OutcomeKind.RATE_LIMITED}) == (
        "fastco/big-model#1")
    for t in (T0 + 2, T0 + 30, T0 + 60):
        assert order(router, now=t)[0] == "slowco/small-model"  # still written first...
        assert serve(router, "auto", t, {}).startswith("fastco/big-model#")  # ...but skipped
    assert serve(router, "auto", T0 + 62, {}) == "slowco/small-model#1"  # back after it


def test_a_route_too_small_for_the_request_is_skipped(router: ProviderRouter) -> None:
    res = router.resolve("auto", MESH)
    first = router.acquire(res.candidates[0], 20_000, T0)  # small-model holds 8192
    assert isinstance(first, list) and first[0].reason == "context"
    assert isinstance(router.acquire(res.candidates[1], 20_000, T0), ChainAttempt)


def test_a_pin_goes_first_and_a_session_does_not_reorder(router: ProviderRouter) -> None:
    router.sessions.served("s1", "qwen", T0)
    assert order(router, session="s1") == WRITTEN  # a session kept on a fallback: no
    assert order(router, pinned="qwen") == ["qwen", *WRITTEN[:2]]


def test_auto_priority_is_every_route_in_the_config_files_order(router: ProviderRouter) -> None:
    assert order(router, "auto:priority") == ["fastco/big-model", "fastco/huge-model",
                                              "slowco/small-model", "llama", "qwen"]
    res = router.resolve("auto:ordered", MESH)  # a profile without a strategy: [routing]'s
    assert res.strategy == "priority" and order(router, "auto:ordered") == [
        "qwen", "fastco/huge-model"]


def test_the_chain_view_has_null_scores_and_1_based_positions(cfg: ProvidersConfig,
                                                              router: ProviderRouter) -> None:
    view = router.chain_view(router.resolve("auto", MESH), T0)
    assert view["strategy"] == "priority"
    assert [(r["route"], r["position"], r["score"]) for r in view["chain"]] == [
        ("slowco/small-model", 1, None), ("fastco/big-model", 2, None), ("qwen", 3, None)]
    assert all(0 < r["reliability"] <= 1 for r in view["chain"])  # the axes are still shown
    scored = ProviderRouter(cfg).chain_view(ProviderRouter(cfg).resolve("auto", MESH), T0)
    assert scored["strategy"] == "balanced"  # a scoring strategy: positions as written too
    assert sorted(r["position"] for r in scored["chain"]) == [1, 2]
    assert all(isinstance(r["score"], float) for r in scored["chain"])
