"""`strategy = "priority"` through a gateway on a loopback port and the official openai client
(issue 24): the written order on every request while the first route is usable, a cooled-down
route skipped until its cooldown ends (a fake clock), outcomes still measured, and
`/v1/routing/chain` showing `score: null` and each route's position."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from ..conftest import FakeClock
from .fake_provider import FakeProvider, Reply
from .gateway import HI, Running, gateway, providers_doc

T0 = 1_796_040_000.0
WRITTEN = ("slowco/small-model", "fastco/big-model")  # the "free key first" route first


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(T0)


@pytest.fixture
def gw(providers: tuple[FakeProvider, FakeProvider], clock: FakeClock) -> Iterator[Running]:
    fast, slow = providers
    doc = providers_doc(fast, slow, chain=WRITTEN, routing={"strategy": "priority"})
    with gateway(doc, clock=clock) as running:
        yield running


def ask(client: openai.OpenAI) -> tuple[str, list[str]]:
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=HI)  # type: ignore[arg-type]
    raw.parse()
    return raw.headers["x-meshroute-route"], raw.headers["x-meshroute-tried"].split(",")


def chain_view(gw: Running) -> dict[str, Any]:
    view = httpx.get(f"{gw.url}/v1/routing/chain", params={"model": "auto"})
    assert view.status_code == 200
    doc: dict[str, Any] = view.json()
    return doc


def test_the_written_order_holds_across_many_requests_even_when_the_first_fails(
        providers: tuple[FakeProvider, FakeProvider], gw: Running, clock: FakeClock) -> None:
    fast, slow = providers
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="client-own-key", max_retries=0)
    served = []
    for i in range(24):
        clock.advance(1.0)
        if i % 3 == 2:  # every third request the first route fails: that one falls over
            slow.push(Reply.error(500))
        served.append(ask(client))
    assert all(tried[0] == "slowco/small-model#1" for _, tried in served)  # first, every time
    assert [route.split("#")[0] for route, _ in served] == [
        WRITTEN[1] if i % 3 == 2 else WRITTEN[0] for i in range(24)]  # and back at once
    assert len(slow.seen) == 24 and len(fast.seen) == 8
    # measured as under any strategy: the first route's failures and the second's successes
    rows = {r["route"]: r for r in chain_view(gw)["chain"]}
    assert rows["slowco/small-model"]["reliability"] < rows["fastco/big-model"]["reliability"]
    # a scoring strategy would now rank fastco first; priority keeps the written order
    assert [r["route"] for r in chain_view(gw)["chain"]] == list(WRITTEN)


def test_a_cooled_down_route_is_skipped_then_first_again(
        providers: tuple[FakeProvider, FakeProvider], gw: Running, clock: FakeClock) -> None:
    _, slow = providers
    client = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="client-own-key", max_retries=0)
    assert ask(client) == ("slowco/small-model#1", ["slowco/small-model#1"])
    slow.push(Reply.rate_limited("30"))  # its only key cools for 30 s
    clock.advance(1.0)
    route, tried = ask(client)
    assert route.startswith("fastco/") and tried == ["slowco/small-model#1", route]
    keys = chain_view(gw)["chain"][0]["keys"]
    assert [k["state"] for k in keys] == ["cooldown"]
    for _ in range(5):  # while it cools: not even tried
        clock.advance(4.0)
        route, tried = ask(client)
        assert route.startswith("fastco/") and tried == [route]
    assert len(slow.seen) == 2
    clock.advance(10.0)  # 31 s after the 429: the cooldown is over
    assert ask(client) == ("slowco/small-model#1", ["slowco/small-model#1"])
    assert len(slow.seen) == 3


def test_the_chain_endpoint_shows_null_scores_and_positions(gw: Running) -> None:
    view = chain_view(gw)
    assert view["strategy"] == "priority"
    assert [(r["route"], r["position"], r["score"]) for r in view["chain"]] == [
        ("slowco/small-model", 1, None), ("fastco/big-model", 2, None)]
    assert all(0 < r["reliability"] < 1 for r in view["chain"])  # the axes are still shown
    models = httpx.get(f"{gw.url}/v1/models").json()["data"]
    assert next(m for m in models if m["id"] == "auto")["strategy"] == "priority"
