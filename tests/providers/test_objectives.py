"""Per-request objectives through a real gateway (issue 26), with the official openai client:
`cost` moves a chain's traffic from a paid provider to a free one, in the body or the header;
a bad value is a 400; the field never reaches an upstream; events and /v1/routing show it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from ..upstream import FakeChat, ServerThread
from .fake_provider import FakeProvider
from .gateway import HI, Running, gateway, providers_doc

PAID, FREE = "fastco/big-model", "slowco/small-model"


@pytest.fixture
def gw(providers: tuple[FakeProvider, FakeProvider]) -> Iterator[tuple[Running, FakeChat]]:
    """`auto` chains the paid big-model ($3/$9 per M, tier large) and the free small-model
    (tier small) under `smartest`, which prefers the large tier; a mesh model qwen beside."""
    fast, slow = providers
    doc = providers_doc(fast, slow, routing={"strategy": "smartest"})
    doc["providers"][0]["models"][0].update(price_in=3.0, price_out=9.0)
    node = FakeChat("n1", tokens=6)
    with ServerThread(node.app()) as head, gateway(doc) as running:
        resp = httpx.post(f"{running.url}/v1/nodes", json={
            "node_id": "n1", "model": "qwen", "start": 0, "end": 39, "layers": 40,
            "url": head.url})
        assert resp.status_code == 201
        yield running, node


def client(gw: Running, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0, **kw)


def served_by(gw: Running, n: int, **kw: Any) -> list[str]:
    """The provider route (`fastco/big-model`) of each of `n` answers to `auto`."""
    out = []
    for _ in range(n):
        raw = client(gw).chat.completions.with_raw_response.create(model="auto", messages=HI,
                                                                   **kw)
        assert raw.parse().choices
        out.append(raw.headers["x-meshroute-route"].split("#")[0])
    return out


def test_cost_moves_traffic_from_a_paid_provider_to_a_free_one(
        gw: tuple[Running, FakeChat], providers: tuple[FakeProvider, FakeProvider]) -> None:
    running, _ = gw
    fast, slow = providers
    by_strategy = served_by(running, 12)
    by_body = served_by(running, 12, extra_body={"meshroute": {"objective": "cost"}})
    by_header = served_by(running, 12, extra_headers={"x-meshroute-objective": "cost"})
    assert by_strategy.count(PAID) >= 9  # of 12: smartest takes the large tier
    assert by_body == by_header == [FREE] * 12
    for seen in fast.seen + slow.seen:  # the option never reaches an upstream
        assert "meshroute" not in seen.body
        assert not any(h.startswith("x-meshroute") for h in seen.headers)
    table = httpx.get(f"{running.url}/v1/routing").json()
    assert table["objectives"] == {"throughput": 12, "ttft": 0, "cost": 24}


def test_the_objective_is_in_the_decision_events(gw: tuple[Running, FakeChat]) -> None:
    running, node = gw
    client(running).chat.completions.create(model="auto", messages=HI,
                                            extra_body={"meshroute": {"objective": "cost"}})
    client(running).chat.completions.create(model="qwen", messages=HI,
                                            extra_headers={"x-meshroute-objective": "ttft"})
    client(running).chat.completions.create(model="qwen", messages=HI,
                                            extra_body={"meshroute": {"objective": "ttft"}})
    client(running).chat.completions.create(model="qwen", messages=HI)
    events = [e for e in running.gateway.telemetry.events.history()]
    selected = [(e["mode"], e["objective"]) for e in events if e["type"] == "route-selected"]
    assert selected[0] == ("provider", "cost")
    assert [o for _, o in selected[1:]] == ["ttft", "ttft", "throughput"]
    outcomes = [e["objective"] for e in events if e["type"] == "outcome"]
    assert outcomes == ["cost", "ttft", "ttft", "throughput"]
    assert [json.dumps(s["body"]).count("meshroute") for s in node.seen] == [0, 0, 0]
    assert all(not k.startswith("x-meshroute-objective") for s in node.seen
               for k in s["headers"])


@pytest.mark.parametrize(("model", "kw"), [
    ("auto", {"extra_body": {"meshroute": {"objective": "cheapest"}}}),
    ("qwen", {"extra_body": {"meshroute": {"objective": ["ttft"]}}}),
    ("auto", {"extra_headers": {"x-meshroute-objective": "latency"}}),
    ("qwen", {"extra_headers": {"x-meshroute-objective": "Cost"}}),
])
def test_a_bad_objective_is_a_400_naming_the_allowed_values(
        gw: tuple[Running, FakeChat], providers: tuple[FakeProvider, FakeProvider],
        model: str, kw: dict[str, Any]) -> None:
    running, node = gw
    with pytest.raises(openai.BadRequestError) as err:
        client(running).chat.completions.create(model=model, messages=HI, **kw)
    assert err.value.code == "invalid_objective"
    assert "'throughput', 'ttft', 'cost'" in err.value.message
    fast, slow = providers
    assert fast.seen == slow.seen == node.seen == []  # nothing was sent anywhere


def test_the_chain_view_ranks_by_an_objective(gw: tuple[Running, FakeChat]) -> None:
    running, _ = gw
    url = f"{running.url}/v1/routing/chain"
    plain = httpx.get(url, params={"model": "auto"}).json()
    cost = httpx.get(url, params={"model": "auto", "objective": "cost"}).json()
    bad = httpx.get(url, params={"model": "auto", "objective": "free"})
    assert plain["objective"] == "throughput" and cost["objective"] == "cost"
    assert [r["route"] for r in plain["chain"]] == [PAID, FREE]
    assert [r["route"] for r in cost["chain"]] == [FREE, PAID]
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_objective"


def test_a_chains_mesh_entry_chooses_by_the_requests_objective(
        gw: tuple[Running, FakeChat]) -> None:
    """The chain's mesh model qwen, pinned first: its own decision (the mesh bandit's) carries
    the request's objective, as its event says."""
    running, node = gw
    answer = client(running).chat.completions.with_raw_response.create(
        model="auto:fast", messages=HI,
        extra_body={"route": ["qwen"], "meshroute": {"objective": "ttft"}})
    assert answer.headers["x-meshroute-route"] == "qwen|n1[0-39]"
    events = running.gateway.telemetry.events.history()
    mesh = [e for e in events if e["type"] == "route-selected" and e["mode"] != "provider"]
    assert [(e["model"], e["objective"]) for e in mesh] == [("qwen", "ttft")]
    assert "meshroute" not in node.seen[-1]["body"] and "route" not in node.seen[-1]["body"]
