"""A request's objective over a provider chain (issue 26): `ttft` and `cost` override the
strategy's ranking, `throughput` is the strategy's own, `priority` keeps the written order."""

from __future__ import annotations

import random

import pytest

from meshroute_middleware.core.objectives import COST, THROUGHPUT, TTFT
from meshroute_middleware.core.providers.config import parse_providers_config
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.core.providers.scoring import OutcomeKind, first_token_score

from .conftest import MESH, T0, doc
from .test_router import routes, serve, warm


def decoder_and_first_token() -> ProviderRouter:
    """big-model decodes at 200 tok/s but its first token takes 3 s; small-model decodes at
    40 tok/s with its first token after 250 ms; both always answer."""
    router = ProviderRouter(parse_providers_config(doc()))
    for i in range(30):
        serve(router, "fastco/big-model", T0 + i, OutcomeKind.SUCCESS, tokens_per_s=200.0,
              ttfb_ms=3000.0, used_tokens=50)
        serve(router, "slowco/small-model", T0 + i, OutcomeKind.SUCCESS, tokens_per_s=40.0,
              ttfb_ms=250.0, used_tokens=50)
    return router


def firsts(router: ProviderRouter, model: str, objective: str, n: int = 60) -> list[str]:
    res = router.resolve(model, MESH)
    rng = random.Random(7)
    return [routes(router.rank(res, T0 + 40, rng, objective=objective))[0]  # type: ignore[arg-type]
            for _ in range(n)]


def test_ttft_moves_traffic_from_a_fast_decoder_to_a_quick_first_token() -> None:
    """The profile `coding` chains small-model and big-model under `balanced`."""
    router = decoder_and_first_token()
    by_strategy = firsts(router, "auto:coding", THROUGHPUT)
    by_ttft = firsts(router, "auto:coding", TTFT)
    assert by_strategy.count("fastco/big-model") >= 45  # of 60
    assert by_ttft.count("slowco/small-model") >= 45


def test_cost_ranks_free_routes_first_then_by_speed() -> None:
    """smartest puts the frontier model ($3/$15 per M) first; `cost` puts the free routes
    first (the mesh model qwen and the unpriced small-model: qwen, faster and surer, leads),
    then big-model ($0.5/$1.5), then huge-model."""
    router = ProviderRouter(parse_providers_config(doc()))
    warm(router, T0)
    res = router.resolve("auto:smart", MESH)
    rng = random.Random(2)
    for _ in range(30):
        assert routes(router.rank(res, T0 + 40, rng))[0] == "fastco/huge-model"
        by_cost = routes(router.rank(res, T0 + 40, rng, objective=COST))
        assert set(by_cost[:3]) == {"qwen", "llama", "slowco/small-model"}
        assert by_cost[3:] == ["fastco/big-model", "fastco/huge-model"]
    shown = router.rank(res, T0 + 40, objective=COST)  # expected values: qwen leads the free
    assert routes(shown)[0] == "qwen"


def test_cost_is_not_reordered_by_a_session() -> None:
    router = ProviderRouter(parse_providers_config(doc()))
    warm(router, T0)
    router.sessions.served("s1", "fastco/huge-model", T0 + 39)
    res = router.resolve("auto:smart", MESH)
    assert routes(router.rank(res, T0 + 40, session="s1"))[0] == "fastco/huge-model"
    ranked = routes(router.rank(res, T0 + 40, session="s1", objective=COST))
    assert ranked[-1] == "fastco/huge-model"
    pinned = routes(router.rank(res, T0 + 40, pinned="fastco/huge-model", objective=COST))
    assert pinned[0] == "fastco/huge-model"  # a pin still goes first


@pytest.mark.parametrize("objective", [COST, TTFT, THROUGHPUT])
def test_priority_keeps_the_written_order_whatever_the_objective(objective: str) -> None:
    d = doc()
    d["routing"]["strategy"] = "priority"
    del d["routing"]["profile"]
    router = ProviderRouter(parse_providers_config(d))
    warm(router, T0)
    res = router.resolve("auto", MESH)
    ranked = router.rank(res, T0 + 40, random.Random(1), objective=objective)  # type: ignore[arg-type]
    assert routes(ranked) == ["fastco/big-model", "slowco/small-model", "qwen"]
    assert all(s.score is None for s in ranked)


def test_throughput_is_the_strategys_ranking_draw_for_draw() -> None:
    router = ProviderRouter(parse_providers_config(doc()))
    warm(router, T0)
    res = router.resolve("auto:fast", MESH)
    a, b = random.Random(9), random.Random(9)
    for _ in range(20):
        assert (router.rank(res, T0 + 40, a)
                == router.rank(res, T0 + 40, b, objective=THROUGHPUT))


@pytest.mark.parametrize(("ttfb_ms", "score"), [
    (None, 0.6), (0.0, 1.0), (250.0, 0.8), (1000.0, 0.5), (4000.0, 0.2)])
def test_the_first_token_axis(ttfb_ms: float | None, score: float) -> None:
    assert first_token_score(ttfb_ms) == pytest.approx(score)
