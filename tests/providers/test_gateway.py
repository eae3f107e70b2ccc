"""The gateway's provider chain over real HTTP: fake providers on loopback, a real gateway."""

from __future__ import annotations

import json

import httpx

from ..conftest import FakeClock
from .fake_provider import FakeProvider, Reply
from .gateway import ENV, assert_no_key_in, gateway, providers_doc

T0 = 1_796_040_000.0


def test_keys_round_robin_the_upstream_gets_its_own_id_and_key_never_the_clients(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    with gateway(providers_doc(fast, slow)) as gw:
        answers = [gw.chat("fastco/big-model", headers={"Authorization": "Bearer client-own"})
                   for _ in range(4)]
    assert [a.status_code for a in answers] == [200] * 4
    assert [a.headers["x-meshroute-route"] for a in answers] == [
        "fastco/big-model#1", "fastco/big-model#2"] * 2
    assert {a.headers["x-meshroute-attempts"] for a in answers} == {"1"}
    assert answers[0].headers["x-meshroute-tried"] == "fastco/big-model#1"
    assert fast.keys == [ENV["FAST_A"], ENV["FAST_B"]] * 2
    assert {s.model for s in fast.seen} == {"big-model"}
    assert all("client-own" not in json.dumps(s.headers) for s in fast.seen)
    assert answers[0].json()["choices"][0]["message"]["content"].startswith("t0")
    assert_no_key_in(*(a.text + json.dumps(dict(a.headers)) for a in answers))


def test_a_429_cools_the_key_from_retry_after_the_next_key_serves_and_clear_ends_it(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.by_key[ENV["FAST_A"]] = Reply.rate_limited("20")
    clock = FakeClock(T0)
    with gateway(providers_doc(fast, slow), clock=clock) as gw:
        first = gw.chat("auto", route=["fastco/big-model"])
        assert first.status_code == 200
        assert first.headers["x-meshroute-tried"] == "fastco/big-model#1,fastco/big-model#2"
        assert first.headers["x-meshroute-route"] == "fastco/big-model#2"
        assert first.headers["x-meshroute-attempts"] == "2"
        view = httpx.get(f"{gw.url}/v1/routing/chain", params={"model": "fastco/big-model"})
        assert view.status_code == 200
        keys = view.json()["chain"][0]["keys"]
        assert keys[0] == {"key": 1, "state": "cooldown", "until": T0 + 20,
                           "reason": "cooldown", "limits": "local"}
        second = gw.chat("fastco/big-model")  # key 1 is cooling: key 2 serves, not sent to 1
        assert second.headers["x-meshroute-tried"] == "fastco/big-model#2"
        fast.by_key.clear()
        cleared = httpx.post(f"{gw.url}/v1/cooldowns/clear",
                             json={"route": "fastco/big-model"})
        assert cleared.status_code == 200 and cleared.json()["cleared"] == 1
        assert gw.chat("fastco/big-model").headers["x-meshroute-route"] == "fastco/big-model#1"
        assert_no_key_in(view.text, first.text)


def test_exhaustion_is_429_with_every_reason_and_retry_after(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.default = Reply.rate_limited("40")
    slow.default = Reply.error(502)
    clock = FakeClock(T0)
    with gateway(providers_doc(fast, slow), clock=clock) as gw:
        answer = gw.chat("auto")
        assert answer.status_code == 429
        assert answer.headers["retry-after"] == "40"
        error = answer.json()["error"]
        assert error["code"] == "rate_limited"
        assert {(r["route"], r["reason"]) for r in error["routes"]} == {
            ("fastco/big-model#1", "http_429"), ("fastco/big-model#2", "http_429"),
            ("slowco/small-model#1", "http_5xx")}
        assert answer.headers["x-meshroute-attempts"] == "3"
        clock.advance(10)
        again = gw.chat("auto")  # both fastco keys cool: not sent, reason cooldown
        assert again.status_code == 429 and again.headers["retry-after"] == "30"
        reasons = {(r["route"], r["reason"]) for r in again.json()["error"]["routes"]}
        assert ("fastco/big-model#1", "cooldown") in reasons
        assert len(fast.seen) == 2


def test_a_request_larger_than_every_context_is_413_and_nothing_is_sent(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    with gateway(providers_doc(fast, slow)) as gw:
        answer = gw.chat("auto", max_tokens=5000)
    assert answer.status_code == 413
    assert {r["reason"] for r in answer.json()["error"]["routes"]} == {"context"}
    assert fast.seen == [] and slow.seen == []


def test_unknown_alias_is_400_unknown_model_404_nothing_configured_503(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    with gateway(providers_doc(fast, slow, chain=("qwen",), mesh={"qwen": {}})) as gw:
        assert gw.chat("auto:nonsense").status_code == 400
        assert gw.chat("auto:nonsense").json()["error"]["code"] == "invalid_model"
        assert gw.chat("fastco/no-such").status_code == 404
        assert gw.chat("fastco/no-such").headers["x-meshroute-attempts"] == "0"
        empty = gw.chat("auto")  # the chain names a mesh model no node serves
        assert empty.status_code == 503
        assert empty.json()["error"]["code"] == "no_route_available"


def test_an_upstream_4xx_is_relayed_scrubbed_of_the_key_and_blames_nobody(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.default = Reply(422, echo_key=True)  # 401 and 403 refuse the key: test_key_refused
    with gateway(providers_doc(fast, slow)) as gw:
        answer = gw.chat("fastco/big-model")
        view = httpx.get(f"{gw.url}/v1/routing/chain", params={"model": "fastco/big-model"})
    assert answer.status_code == 422
    assert answer.headers["x-meshroute-route"] == "fastco/big-model#1"
    assert "(key ***)" in answer.json()["error"]["message"]
    assert_no_key_in(answer.text)
    assert view.json()["chain"][0]["reliability"] == 0.5  # the prior: nothing counted
    assert slow.seen == []


def test_an_upstream_context_length_refusal_falls_over_and_blames_nobody(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.default = Reply(400, message="This model's maximum context length is 4096 tokens")
    with gateway(providers_doc(fast, slow)) as gw:
        answer = gw.chat("auto", route=["fastco/big-model"])
        view = httpx.get(f"{gw.url}/v1/routing/chain", params={"model": "fastco/big-model"})
    assert answer.status_code == 200
    assert answer.headers["x-meshroute-tried"] == "fastco/big-model#1,slowco/small-model#1"
    assert view.json()["chain"][0]["reliability"] == 0.5
