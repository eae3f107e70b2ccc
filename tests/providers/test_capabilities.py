"""Capability filtering over a real gateway, driven by the official openai client: a request
with an image, tools or a JSON schema goes only to routes that declare them (issue 25)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from ..upstream import FakeChat, ServerThread
from .fake_provider import FakeProvider, Reply
from .gateway import HI, gateway, providers_doc

IMAGE = [{"role": "user", "content": [
    {"type": "text", "text": "what is this?"},
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}


def join(url: str, node_id: str, head: str, model: str = "m", **kw: Any) -> None:
    resp = httpx.post(f"{url}/v1/nodes", json={
        "node_id": node_id, "model": model, "start": 0, "end": 39, "layers": 40,
        "url": head, **kw})
    assert resp.status_code in (200, 201), resp.text


@pytest.fixture
def mesh(providers: tuple[FakeProvider, FakeProvider]) -> Iterator[dict[str, Any]]:
    """Model m: a fast node that declares nothing beyond chat, a slow one that sees and calls
    tools; model n: one text-only node."""
    plain, eyes = FakeChat("plain", tokens=4), FakeChat("eyes", tokens=4)
    fast, slow = providers
    with ServerThread(plain.app()) as p, ServerThread(eyes.app()) as e, \
            gateway(providers_doc(fast, slow)) as gw:
        join(gw.url, "plain", p.url, tps=500.0, caps=[])
        join(gw.url, "eyes", e.url, tps=2.0, caps=["vision", "tools", "json_schema"])
        join(gw.url, "text", p.url, model="n", caps=["tools"])
        yield {"url": gw.url, "plain": plain, "eyes": eyes,
               "client": openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)}


@pytest.mark.parametrize("extra", [
    {"messages": IMAGE}, {"tools": TOOLS}, {"response_format": SCHEMA}],
    ids=["vision", "tools", "json_schema"])
def test_a_request_skips_the_faster_route_without_the_capability(
        mesh: dict[str, Any], extra: dict[str, Any]) -> None:
    client = mesh["client"]
    for _ in range(4):
        raw = client.chat.completions.with_raw_response.create(
            model="m", **{"messages": HI, **extra})
        assert raw.headers["x-meshroute-route"] == "m|eyes[0-39]"
    assert mesh["plain"].seen == [] and len(mesh["eyes"].seen) == 4
    plain = client.chat.completions.with_raw_response.create(model="m", messages=HI)
    assert plain.headers["x-meshroute-route"] == "m|plain[0-39]"  # the fast one otherwise


def test_routes_and_models_show_their_capabilities(mesh: dict[str, Any]) -> None:
    rows = httpx.get(mesh["url"] + "/v1/routing", params={"model": "m"}).json()
    caps = {r["head"]: r["caps"] for r in rows["models"]["m"]["candidates"]}
    assert caps == {"plain": [], "eyes": ["vision", "tools", "json_schema"]}
    models = {m["id"]: m for m in httpx.get(mesh["url"] + "/v1/models").json()["data"]}
    assert models["m"]["capabilities"] == ["vision", "tools", "json_schema"]
    assert models["n"]["capabilities"] == ["tools"]
    assert mesh["client"].models.retrieve("n").model_extra["capabilities"] == ["tools"]
    refused = httpx.post(mesh["url"] + "/v1/nodes", json={
        "node_id": "odd", "model": "m", "start": 0, "end": 39, "layers": 40,
        "url": "http://127.0.0.1:9", "caps": ["vision", "mind-reading"]})
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "invalid_node"
    assert "mind-reading" in refused.json()["error"]["message"]


def test_no_route_with_the_capability_is_a_400_naming_it(mesh: dict[str, Any]) -> None:
    client = mesh["client"]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="n", messages=IMAGE)
    assert info.value.code == "unsupported_capability"
    assert "vision" in info.value.message
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError, match="vision"):
        client.chat.completions.create(model="m", messages=IMAGE, extra_body={
            "route": ["plain"]})  # a pin to a route without it is refused too
    assert client.chat.completions.create(model="n", messages=HI, tools=TOOLS).choices


def test_the_provider_chain_skips_models_without_the_capability() -> None:
    fast, slow = FakeProvider("fast"), FakeProvider("slow", models=("small-model",))
    with fast.serve(), slow.serve():
        doc = providers_doc(fast, slow, chain=("slowco/small-model", "fastco/big-model"))
        doc["providers"][0]["models"][0]["capabilities"] = ["vision", "tools"]
        doc["providers"][1]["models"][0]["capabilities"] = []
        with gateway(doc) as gw:
            client = openai.OpenAI(base_url=gw.url + "/v1", api_key="x", max_retries=0)
            for extra in ({"messages": IMAGE}, {"messages": HI, "tools": TOOLS}):
                raw = client.chat.completions.with_raw_response.create(model="auto", **extra)
                assert raw.headers["x-meshroute-tried"].startswith("fastco/big-model#")
            assert slow.seen == []
            with pytest.raises(openai.BadRequestError) as info:
                client.chat.completions.create(model="auto", messages=HI,
                                               response_format=SCHEMA)  # type: ignore[arg-type]
            assert info.value.code == "unsupported_capability"
            assert "json_schema" in info.value.message
            # the one capable route is rate limited on both keys: the usual exhaustion, and
            # the route without the capability listed with reason `capability`
            fast.push(Reply.rate_limited("30"), Reply.rate_limited("30"))
            with pytest.raises(openai.RateLimitError) as limited:
                client.chat.completions.create(model="auto", messages=IMAGE)
            body = limited.value.body
            assert isinstance(body, dict) and body["code"] == "rate_limited"
            reasons = {r["route"]: r["reason"] for r in body["routes"]}
            assert reasons == {"slowco/small-model": "capability",
                               "fastco/big-model#1": "http_429",
                               "fastco/big-model#2": "http_429"}
            assert slow.seen == []


def test_a_chain_mesh_entry_without_the_capability_is_passed_over(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    node = FakeChat("n1", tokens=4)
    doc = providers_doc(fast, slow, chain=("qwen", "slowco/small-model"), mesh={"qwen": {}})
    doc["providers"][1]["models"][0]["capabilities"] = ["vision"]
    with ServerThread(node.app()) as head, gateway(doc) as gw:
        join(gw.url, "n1", head.url, model="qwen", caps=[])
        answer = gw.chat("auto", messages=IMAGE)
        assert answer.status_code == 200, answer.text
        assert answer.headers["x-meshroute-tried"] == "slowco/small-model#1"
        assert node.seen == []
