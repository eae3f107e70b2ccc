"""Provider-key affinity's learned trade-off (issue 35): what a cache hit saves in first-byte
time is learned per provider route (core/providers/affinity.py `FirstBytes`, the mesh's
prefill rule), and a warm conversation keeps its route and key unless another route is
faster by more than that saving (and the cached price) is worth. Fabricated statistics on a
fake clock; then through a gateway whose two-key provider answers cached turns sooner."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from meshroute_middleware.core.providers.affinity import (
    PRIOR_SAVING_S_PER_KTOK,
    FirstBytes,
    Turn,
    Verdict,
    key_order,
)
from meshroute_middleware.core.providers.config import parse_providers_config
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.core.providers.scoring import OutcomeKind, RouteStats

from ..conftest import FakeClock
from .fake_provider import FakeProvider, Reply
from .gateway import providers_doc
from .test_affinity import ROUTE, T0, config_doc, take
from .test_client_spend import served

SLOW = "slowco/small-model"
WARM, PROMPT = 4000, 4200  # a returning turn: 4,000 of its 4,200 tokens in the warm cache


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


# -- learning what a cached token saves -------------------------------------------------------

def test_with_nothing_learned_the_prior_saving_stands() -> None:
    first = FirstBytes()
    assert first.fit(ROUTE) is None
    assert first.saving_s(ROUTE, 8000) == pytest.approx(8 * PRIOR_SAVING_S_PER_KTOK)
    assert first.expected_ms(ROUTE, 1200.0, 8200, 8000) == pytest.approx(
        1200.0 - 8000 * PRIOR_SAVING_S_PER_KTOK)
    assert first.expected_ms(ROUTE, None, 8200, 8000) is None


def test_the_saving_per_cached_token_is_learned_from_warm_and_cold_turns() -> None:
    """Cold turns of 4,000 tokens take 1 s to their first byte, warm ones (200 uncached)
    0.2 s: each cached kilotoken saves 0.8 / 3.8 s, not the prior's 0.05 s."""
    first = FirstBytes()
    first.add(ROUTE, 4000, 0, 1000.0)
    first.add(ROUTE, PROMPT, WARM, 200.0)
    few = first.saving_s(ROUTE, WARM)  # two turns: still near the prior (0.2 s)
    for _ in range(49):
        first.add(ROUTE, 4000, 0, 1000.0)
        first.add(ROUTE, PROMPT, WARM, 200.0)
    fit = first.fit(ROUTE)
    assert fit is not None
    assert fit[1] == pytest.approx(0.8 / 3.8, rel=0.05)
    assert 0.2 < few < first.saving_s(ROUTE, WARM) == pytest.approx(4 * 0.8 / 3.8, rel=0.05)
    assert first.expected_ms(ROUTE, None, PROMPT, WARM) == pytest.approx(200.0, rel=0.15)
    assert first.expected_ms(ROUTE, None, PROMPT, 0) == pytest.approx(1042.0, rel=0.05)


def test_old_turns_fade_as_the_other_statistics_do() -> None:
    """The fit forgets (PrefillFit's decay): a provider whose cache stopped saving time
    (every turn 1 s, cached or not) is learned to save little within a few hundred turns."""
    first = FirstBytes()
    for _ in range(50):
        first.add(ROUTE, 4000, 0, 1000.0)
        first.add(ROUTE, PROMPT, WARM, 200.0)
    before = first.saving_s(ROUTE, WARM)
    for _ in range(300):
        first.add(ROUTE, 4000, 0, 1000.0)
        first.add(ROUTE, PROMPT, WARM, 1000.0)
    assert before > 0.8 and first.saving_s(ROUTE, WARM) < 0.25 * before


# -- the trade-off in the ranking -------------------------------------------------------------

def fabricated(slow_ms: float) -> ProviderRouter:
    """Two routes equal in all but first-byte time: fastco answers a cold 4,000-token prompt
    in 3 s and a warm one in 0.6 s (learned from its turns); slowco in `slow_ms` whatever
    the prompt. The conversation 77 was served by fastco's first key in its order at T0."""
    router = ProviderRouter(parse_providers_config(config_doc()))
    router.stats[ROUTE] = RouteStats(ok=50.0, tokens_per_s=50.0, ttfb_ms=1400.0)
    router.stats[SLOW] = RouteStats(ok=50.0, tokens_per_s=50.0, ttfb_ms=slow_ms)
    for _ in range(30):
        router.first_bytes.add(ROUTE, 4000, 0, 3000.0)
        router.first_bytes.add(ROUTE, PROMPT, WARM, 600.0)
        router.first_bytes.add(SLOW, 4000, 0, slow_ms)
        router.first_bytes.add(SLOW, PROMPT, 0, slow_ms)
    router.affinity.served(Turn(77, WARM), ROUTE, key_order(77, ROUTE, 2)[0], T0)
    return router


def test_the_warm_key_is_kept_when_its_saving_outweighs_a_faster_cold_route() -> None:
    """slowco (1.5 s) is faster than fastco for a cold prompt (3 s); the warm turn (0.6 s
    expected) stays on fastco's warm key."""
    router = fabricated(1500.0)
    res, turn = router.resolve("auto", ()), Turn(77, PROMPT)
    cold = {c.route: router.score(c, res.strategy, T0, turn=(PROMPT, 0)).score
            for c in res.candidates}
    assert cold[SLOW] > cold[ROUTE]
    ranked = router.rank(res, T0 + 10, turn=turn)
    assert ranked[0].candidate.route == ROUTE and ranked.affinity == Verdict.KEPT
    assert take(router, ROUTE, turn, T0 + 10).key == key_order(77, ROUTE, 2)[0]


def test_the_warm_route_is_left_when_another_is_faster_by_more_than_the_saving() -> None:
    router = fabricated(400.0)  # faster than fastco even warm
    ranked = router.rank(router.resolve("auto", ()), T0 + 10, turn=Turn(77, PROMPT))
    assert ranked[0].candidate.route == SLOW and ranked.affinity == Verdict.WORSE


@pytest.mark.parametrize(("warm", "kept"), [(8000, True), (2000, False)])
def test_before_anything_is_learned_the_prior_decides(warm: int, kept: bool) -> None:
    """No fits yet, only mean first bytes (fastco 1.2 s, slowco 1 s): 8,000 warm tokens
    save 0.4 s by the prior (kept), 2,000 save 0.1 s (left)."""
    router = ProviderRouter(parse_providers_config(config_doc()))
    router.stats[ROUTE] = RouteStats(ok=50.0, tokens_per_s=50.0, ttfb_ms=1200.0)
    router.stats[SLOW] = RouteStats(ok=50.0, tokens_per_s=50.0, ttfb_ms=1000.0)
    router.affinity.served(Turn(5, warm), ROUTE, 1, T0)
    ranked = router.rank(router.resolve("auto", ()), T0 + 1, turn=Turn(5, warm + 100))
    assert (ranked[0].candidate.route == ROUTE) is kept
    assert ranked.affinity == (Verdict.KEPT if kept else Verdict.WORSE)


def test_the_verdict_says_why_affinity_broke() -> None:
    router = fabricated(4000.0)  # far slower: the 429 costs fastco some reliability too
    res, turn = router.resolve("auto", ()), Turn(77, PROMPT)
    assert router.rank(res, T0 + 1, turn=Turn(1, 10)).affinity == Verdict.NEW
    assert router.rank(res, T0 + 1).affinity is None  # no conversation
    warm = take(router, ROUTE, turn, T0 + 1)
    router.record(warm, OutcomeKind.RATE_LIMITED, T0 + 1, retry_after_s=30.0)
    assert router.rank(res, T0 + 2, turn=turn).affinity == Verdict.COOLING
    # cooled off, and its route's 429 penalty (3 points, one per 2 minutes) mostly decayed
    assert router.rank(res, T0 + 290, turn=turn).affinity == Verdict.KEPT
    assert router.rank(res, T0 + 400, turn=turn).affinity == Verdict.EXPIRED
    assert router.rank(res, T0 + 401, turn=turn).affinity == Verdict.NEW  # and forgotten


def test_a_warm_key_over_its_limits_is_said() -> None:
    doc = config_doc()
    doc["providers"][0]["rpm"] = 1
    router = ProviderRouter(parse_providers_config(doc))
    turn = Turn(5, 100)
    got = take(router, ROUTE, turn, T0)
    router.record(got, OutcomeKind.SUCCESS, T0, turn=turn)
    assert router.rank(router.resolve("auto", ()), T0 + 1, turn=turn).affinity == \
        Verdict.LIMITS


# -- through a gateway ------------------------------------------------------------------------

SYSTEM = "You are a careful assistant. " * 400  # ~2,800 estimated tokens, every turn
COLD_S, OTHER_S = 0.6, 0.25  # fastco's first byte on a cold prompt; slowco's on any


class TimedCache(FakeProvider):
    """A provider whose prompt cache is per key and whose cached turns answer sooner: a
    prompt that extends one this key saw reports that part as cached and answers at once;
    any other waits `cold_s` (the prompt's prefill). Tokens are counted as the gateway
    estimates them (characters / 4), so both speak of the same prompt."""

    def __init__(self, name: str, cold_s: float, caches: bool = True,
                 models: tuple[str, ...] = ("big-model",)) -> None:
        super().__init__(name, models=models)
        self.cold_s, self.caches = cold_s, caches
        self.cache: dict[str | None, set[str]] = {}

    def _next(self, key: str | None) -> Reply:
        messages = self.seen[-1].body.get("messages", [])
        size = [len(json.dumps(m)) // 4 for m in messages]
        seen = self.cache.setdefault(key, set())
        cached = next((sum(size[:n]) for n in range(len(messages) - 1, 0, -1)
                       if self.caches and json.dumps(messages[:n]) in seen), 0)
        seen.add(json.dumps(messages))
        return Reply.ok(prompt_tokens=sum(size), cached_tokens=cached,
                        ttfb_s=0.0 if cached else self.cold_s)


def talk(url: str, opening: str, turns: int, model: str = ROUTE,
         first_model: str | None = None) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    bodies = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"{opening} {turn}"})
        answer = httpx.post(f"{url}/v1/chat/completions", timeout=30, headers={
            "x-meshroute-objective": "ttft"}, json={
            "model": first_model if first_model and not turn else model,
            "messages": messages})
        assert answer.status_code == 200, answer.text
        bodies.append(answer.json())
        messages.append(bodies[-1]["choices"][0]["message"])
    return bodies


@pytest.fixture
def timed() -> Iterator[tuple[TimedCache, TimedCache]]:
    fast = TimedCache("fast", COLD_S)
    slow = TimedCache("slow", OTHER_S, caches=False, models=("small-model",))
    with fast.serve(), slow.serve():
        yield fast, slow


def test_through_a_gateway_the_saving_is_learned_and_keeps_the_warm_key(
        timed: tuple[TimedCache, TimedCache], clock: FakeClock) -> None:
    """fastco's cold first byte (0.6 s) is slower than slowco's (0.25 s); its cached turns
    answer at once. After a few conversations the gateway has learned what fastco's cache
    saves, and a conversation it served stays on its warm key under `auto` with the `ttft`
    objective, though slowco is the faster route for any cold prompt."""
    fast, slow = timed
    doc = providers_doc(fast, slow)
    doc["providers"][0]["cache_ttl"] = "5m"
    for provider in doc["providers"]:  # room for the long system prompt
        provider["models"][0]["context"] = 32768
    with served(doc, [], clock) as gw:
        for name in ("alpha", "beta", "gamma"):  # fastco's turns, cold and warm
            talk(gw.url, name, 3)
        for name in ("delta", "epsilon", "zeta"):  # slowco's first bytes
            talk(gw.url, name, 2, model=SLOW)
        router: ProviderRouter = gw.gateway.providers
        warm_tokens = len(json.dumps({"role": "system", "content": SYSTEM})) // 4
        learned = router.first_bytes.saving_s(ROUTE, warm_tokens)
        res, now = router.resolve("auto", ()), clock()
        cold = {c.route: router.score(c, res.strategy, now, objective="ttft",
                                      turn=(warm_tokens + 40, 0)).score
                for c in res.candidates}
        seen_fast, seen_slow = len(fast.seen), len(slow.seen)
        talk(gw.url, "omega", 4, model="auto", first_model=ROUTE)
    # learned from the turns, not the prior (0.05 s per 1,000 tokens: ~0.14 s here)
    assert learned > COLD_S / 2 > warm_tokens / 1000 * PRIOR_SAVING_S_PER_KTOK, learned
    assert cold[SLOW] > cold[ROUTE]  # for a cold prompt slowco is the better route
    assert len(slow.seen) == seen_slow, "a warm turn left its key for the faster cold route"
    keys = fast.keys[seen_fast:]
    assert len(keys) == 4 and len(set(keys)) == 1, keys
