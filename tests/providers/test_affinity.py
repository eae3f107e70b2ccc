"""Provider-key affinity (issue 35): a conversation stays on the provider model and key that
served it while the provider's cache is warm (`cache_ttl`), unless the key is cooling or
over its limits; every worker makes the same key choice (core/providers/affinity.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import httpx
import pytest

from meshroute_middleware.core.providers.affinity import (
    DEFAULT_CACHE_TTL_S,
    Affinity,
    Turn,
    key_order,
    parse_ttl,
    preferred,
)
from meshroute_middleware.core.providers.config import (
    ProviderConfigError,
    parse_providers_config,
)
from meshroute_middleware.core.providers.router import ChainAttempt, ProviderRouter
from meshroute_middleware.core.providers.scoring import OutcomeKind, RouteStats

from ..conftest import FakeClock
from .fake_provider import FakeProvider, Reply
from .gateway import providers_doc
from .test_client_spend import served

T0 = 1_700_000_000.0
ROUTE = "fastco/big-model"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


# -- the core ------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "seconds"), [
    ("5m", 300.0), ("300s", 300.0), ("1h", 3600.0), ("500ms", 0.5), (90, 90.0), (0, 0.0),
    ("2.5m", 150.0)])
def test_cache_ttl_reads_seconds_and_units(value: object, seconds: float) -> None:
    assert parse_ttl(value) == seconds


@pytest.mark.parametrize("value", ["5 minutes", "-1s", -3, True, [], "m"])
def test_a_cache_ttl_that_is_no_duration_is_refused_naming_the_key(value: object) -> None:
    doc = config_doc()
    doc["providers"][0]["cache_ttl"] = value
    with pytest.raises(ProviderConfigError, match="cache_ttl"):
        parse_providers_config(doc)


def test_cache_ttl_defaults_to_five_minutes() -> None:
    doc = config_doc()
    del doc["providers"][0]["cache_ttl"]
    assert parse_providers_config(doc).providers[0].cache_ttl_s == DEFAULT_CACHE_TTL_S == 300.0


def test_the_key_order_is_the_same_in_every_process() -> None:
    """Workers share no memory of conversations: each must compute the same order (no salted
    `hash()`), here in a process with another hash seed."""
    conversations = [7, 2**63 + 5, 123456789]
    here = [list(key_order(c, ROUTE, 3)) for c in conversations]
    code = ("import json; from meshroute_middleware.core.providers.affinity import key_order;"
            f"print(json.dumps([list(key_order(c, {ROUTE!r}, 3)) for c in {conversations}]))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": "12345"})
    assert json.loads(other.stdout) == here


def test_conversations_spread_over_the_keys() -> None:
    """Rendezvous hashing spreads conversations as round-robin spreads requests: of 4,000
    conversations over two keys each key leads 50 % ± 4 % (±5 standard deviations)."""
    firsts = [key_order(c * 2654435761 + 1, ROUTE, 2)[0] for c in range(4000)]
    assert abs(firsts.count(1) / 4000 - 0.5) < 0.04


def test_the_warm_key_goes_first_and_is_forgotten_after_the_ttl() -> None:
    affinity, turn = Affinity(), Turn(42, 1000)
    affinity.served(turn, ROUTE, 2, T0, ttl_s=300.0)
    held = affinity.warm(turn, T0 + 300.0)
    assert held is not None and preferred((1, 2), held, ROUTE) == (2, 1)
    assert preferred((1, 2), held, "other/route") == (1, 2)
    assert affinity.warm(turn, T0 + 300.5) is None and len(affinity) == 0
    affinity.served(turn, ROUTE, 2, T0, ttl_s=0.0)  # cache_ttl 0: nothing is remembered
    assert affinity.warm(turn, T0) is None


def config_doc(ttl: object = "5m") -> dict[str, Any]:
    return {"routing": {"chain": [ROUTE, "slowco/small-model"]}, "providers": [
        {"name": "fastco", "base_url": "http://127.0.0.1:1/v1", "cache_ttl": ttl,
         "keys": ["env:FAST_A", "env:FAST_B"],
         "models": [{"id": "big-model", "tier": "large", "price_in": 3.0,
                     "price_cached_in": 0.3}]},
        {"name": "slowco", "base_url": "http://127.0.0.1:2/v1", "keys": ["env:SLOW_A"],
         "models": [{"id": "small-model", "tier": "large", "price_in": 3.0}]}]}


def take(router: ProviderRouter, route: str, turn: Turn, now: float) -> ChainAttempt:
    """What the chain does for a provider route: the conversation's keys in their order."""
    candidate = next(c for c in router.resolve("auto", ()).candidates if c.route == route)
    order = key_order(turn.conversation, route, len(candidate.provider.keys)) \
        if candidate.provider else ()
    got = router.acquire(candidate, 10, now,
                         prefer=preferred(order, router.warm(turn, now)[0], route))
    assert isinstance(got, ChainAttempt), got
    return got


def test_a_cooling_key_breaks_affinity_and_the_new_key_is_kept_while_warm() -> None:
    """Turn 1 on the conversation's first key; a 429 cools it: the turn goes to the other
    key, and stays there while warm even after the cooldown; after the TTL (fake clock) the
    conversation starts from its first key again."""
    router = ProviderRouter(parse_providers_config(config_doc("5m")))
    turn = Turn(99, 500)
    first, second = key_order(99, ROUTE, 2)
    got = take(router, ROUTE, turn, T0)
    assert got.key == first
    router.record(got, OutcomeKind.SUCCESS, T0, turn=turn)
    assert take(router, ROUTE, turn, T0 + 1).key == first  # affinity: not round-robin
    router.record(take(router, ROUTE, turn, T0 + 2), OutcomeKind.RATE_LIMITED, T0 + 2,
                  retry_after_s=30.0, turn=turn)
    moved = take(router, ROUTE, turn, T0 + 3)
    assert moved.key == second  # cooling: affinity yields
    router.record(moved, OutcomeKind.SUCCESS, T0 + 3, turn=turn)
    assert take(router, ROUTE, turn, T0 + 60).key == second  # cooled off, but key 2 is warm
    assert take(router, ROUTE, turn, T0 + 3 + 301).key == first  # the TTL passed


def test_a_key_over_its_limits_breaks_affinity() -> None:
    doc = config_doc()
    doc["providers"][0]["rpm"] = 1
    router = ProviderRouter(parse_providers_config(doc))
    turn = Turn(5, 100)
    first, second = key_order(5, ROUTE, 2)
    got = take(router, ROUTE, turn, T0)
    router.record(got, OutcomeKind.SUCCESS, T0, turn=turn)
    assert got.key == first and take(router, ROUTE, turn, T0 + 1).key == second


def test_the_warm_route_stays_first_unless_clearly_worse() -> None:
    """`auto` over two routes of one price: after slowco served the conversation (8,000
    tokens now in its cache) it stays first while warm though fastco answers 0.1 s sooner
    (the cache saves 0.4 s by the prior: test_affinity_learned.py learns it); once its
    failures sink its score by more than that, it does not."""
    router = ProviderRouter(parse_providers_config(config_doc()))
    res, turn = router.resolve("auto", ()), Turn(11, 8100)
    slow = next(c for c in res.candidates if c.route == "slowco/small-model")
    got = router.acquire(slow, 10, T0)
    assert isinstance(got, ChainAttempt)
    router.record(got, OutcomeKind.SUCCESS, T0, turn=Turn(11, 8000))
    router.stats[ROUTE] = RouteStats(ok=20.0, tokens_per_s=80.0, ttfb_ms=900.0)
    router.stats[slow.route] = RouteStats(ok=20.0, tokens_per_s=80.0, ttfb_ms=1000.0)
    assert router.rank(res, T0 + 1)[0].candidate.route == ROUTE
    assert router.rank(res, T0 + 1, turn=turn)[0].candidate.route == "slowco/small-model"
    for _ in range(8):  # slowco fails: clearly worse now
        router.record(ChainAttempt(slow), OutcomeKind.FAILURE, T0 + 2, reason="http_5xx")
    assert router.rank(res, T0 + 3, turn=turn)[0].candidate.route == ROUTE
    assert router.rank(res, T0 + 400, turn=turn)[0].candidate.route == ROUTE  # and cold


# -- through a gateway ---------------------------------------------------------------------

class CachingProvider(FakeProvider):
    """A provider whose prompt cache is per key: a prompt that extends one this key saw
    reports that prompt's share as cached (10 tokens a message here)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.cache: dict[str | None, set[str]] = {}

    def _next(self, key: str | None) -> Reply:
        messages = self.seen[-1].body.get("messages", [])
        seen = self.cache.setdefault(key, set())
        cached = next((10 * n for n in range(len(messages) - 1, 0, -1)
                       if json.dumps(messages[:n]) in seen), 0)
        seen.add(json.dumps(messages))
        return Reply.ok(prompt_tokens=10 * len(messages), cached_tokens=cached)


def conversation(url: str, opening: str, turns: int) -> list[dict[str, Any]]:
    """A client's conversation: each turn resends the history and the answer; the usages."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
    usages = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"{opening} {turn}"})
        answer = httpx.post(f"{url}/v1/chat/completions", timeout=30, json={
            "model": ROUTE, "messages": messages})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        usages.append(body["usage"])
        messages.append(body["choices"][0]["message"])
    return usages


def test_a_four_turn_conversation_lands_on_one_key_and_turns_two_to_four_are_cached(
        clock: FakeClock) -> None:
    fast, slow = CachingProvider("fast"), FakeProvider("slow", models=("small-model",))
    with fast.serve(), slow.serve():
        doc = providers_doc(fast, slow)
        doc["providers"][0]["cache_ttl"] = "5m"
        with served(doc, [], clock) as gw:
            usages = conversation(gw.url, "first", 4)
            keys = fast.keys
            others = [conversation(gw.url, f"other {i}", 2) for i in range(6)]
    assert len(keys) == 4 and len(set(keys)) == 1, keys
    cached = [u.get("prompt_tokens_details", {}).get("cached_tokens", 0) for u in usages]
    assert cached[0] == 0 and all(c > 0 for c in cached[1:]), usages
    assert all(o[1]["prompt_tokens_details"]["cached_tokens"] > 0 for o in others)
    assert len(set(fast.keys)) == 2  # the other conversations spread over both keys


def test_with_cache_ttl_0_keys_take_turns(clock: FakeClock) -> None:
    fast, slow = CachingProvider("fast"), FakeProvider("slow", models=("small-model",))
    with (fast.serve(), slow.serve(),
          served(providers_doc(fast, slow), [], clock) as gw):  # cache_ttl = 0 there
        conversation(gw.url, "first", 4)
    assert fast.keys[0] != fast.keys[1] and fast.keys[0] == fast.keys[2]
