"""A provider refusing a key (401, 403) takes that key out of rotation, through the gateway:
fake providers on loopback, a real gateway."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from ..conftest import FakeClock
from .fake_provider import FakeProvider, Reply
from .gateway import ENV, assert_no_key_in, gateway, providers_doc

T0 = 1_796_040_000.0


@pytest.fixture
def providers() -> Iterator[tuple[FakeProvider, FakeProvider]]:
    fast = FakeProvider("fast", models=("big-model", "other-model"))
    slow = FakeProvider("slow", models=("small-model",))
    with fast.serve(), slow.serve():
        yield fast, slow


def two_models(fast: FakeProvider, slow: FakeProvider) -> dict[str, Any]:
    doc = providers_doc(fast, slow)
    doc["providers"][0]["models"].append({"id": "other-model", "tier": "small",
                                          "context": 4096})
    return doc


def keys_of(gw_url: str, model: str) -> list[dict[str, object]]:
    view = httpx.get(f"{gw_url}/v1/routing/chain", params={"model": model})
    assert view.status_code == 200
    assert_no_key_in(view.text)
    keys: list[dict[str, object]] = view.json()["chain"][0]["keys"]
    return keys


def test_a_401_takes_the_key_out_of_rotation_and_the_next_key_serves(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.by_key[ENV["FAST_A"]] = Reply(401, echo_key=True)
    with gateway(two_models(fast, slow), clock=FakeClock(T0)) as gw:
        first = gw.chat("fastco/big-model")
        assert first.status_code == 200  # the client never sees our key's 401
        assert first.headers["x-meshroute-tried"] == "fastco/big-model#1,fastco/big-model#2"
        assert keys_of(gw.url, "fastco/big-model")[0] == {
            "key": 1, "state": "revoked", "until": None, "reason": "http_401", "limits": "local"}
        later = [gw.chat("fastco/big-model") for _ in range(3)]
        assert [a.headers["x-meshroute-tried"] for a in later] == ["fastco/big-model#2"] * 3
        assert fast.keys == [ENV["FAST_A"]] + [ENV["FAST_B"]] * 4  # key 1 asked once only
        other = gw.chat("fastco/other-model")  # a 401 is the key's, for every model
        assert other.headers["x-meshroute-route"] == "fastco/other-model#2"
        reliability = httpx.get(f"{gw.url}/v1/routing/chain",
                                params={"model": "fastco/big-model"}).json()["chain"][0]
        assert reliability["reliability"] > 0.5  # four successes, no failure of the route
        fast.by_key.clear()  # the operator fixed the key, then clears it
        cleared = httpx.post(f"{gw.url}/v1/cooldowns/clear",
                             json={"route": "fastco/big-model#1"})
        assert cleared.status_code == 200 and cleared.json()["cleared"] == 1
        assert keys_of(gw.url, "fastco/big-model")[0]["state"] == "ready"
        routes = {gw.chat("fastco/big-model").headers["x-meshroute-route"] for _ in range(2)}
        assert routes == {"fastco/big-model#1", "fastco/big-model#2"}
    assert_no_key_in(first.text, json.dumps(dict(first.headers)))


def test_a_403_takes_the_key_out_for_that_model_only(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.push(Reply(403))
    with gateway(two_models(fast, slow), clock=FakeClock(T0)) as gw:
        first = gw.chat("fastco/big-model")
        assert first.headers["x-meshroute-tried"] == "fastco/big-model#1,fastco/big-model#2"
        assert gw.chat("fastco/big-model").headers["x-meshroute-route"] == "fastco/big-model#2"
        other = gw.chat("fastco/other-model")
        assert other.headers["x-meshroute-route"] == "fastco/other-model#1"
        assert keys_of(gw.url, "fastco/big-model")[0] == {
            "key": 1, "state": "revoked", "until": None, "reason": "http_403", "limits": "local"}
        assert keys_of(gw.url, "fastco/other-model")[0]["state"] == "ready"


def test_every_key_refused_is_exhaustion_then_no_request_is_sent_on_them(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.default = Reply(401)
    with gateway(providers_doc(fast, slow), clock=FakeClock(T0)) as gw:
        refused = gw.chat("fastco/big-model")
        # issue 24: the provider refused the keys; that is no rate limit (was 429)
        assert refused.status_code == 502 and "retry-after" not in refused.headers
        assert refused.json()["error"]["code"] == "upstream_failed"
        assert "refused every key" in refused.json()["error"]["message"]
        assert {r["route"]: r["reason"] for r in refused.json()["error"]["routes"]} == {
            "fastco/big-model#1": "http_401", "fastco/big-model#2": "http_401"}
        again = gw.chat("fastco/big-model")
        # the same state of the gateway, the same answer: 502, saying the keys were refused
        assert again.status_code == 502 and "retry-after" not in again.headers
        assert again.json()["error"]["code"] == "upstream_failed"
        assert "refused every key" in again.json()["error"]["message"]
        assert {r["route"]: r["reason"] for r in again.json()["error"]["routes"]} == {
            "fastco/big-model#1": "revoked", "fastco/big-model#2": "revoked"}
        assert again.headers["x-meshroute-attempts"] == "0" and len(fast.seen) == 2
        fallback = gw.chat("auto")
        assert fallback.status_code == 200
        assert fallback.headers["x-meshroute-route"] == "slowco/small-model#1"
