"""/v1/embeddings and /v1/completions end to end over mesh routes: real uvicorn on loopback
ports, emulated nodes declaring the capabilities, the official openai client."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import openai
import pytest

from node_agent.chat import words
from node_agent.embeddings import vector
from node_agent.emulator import EmulatedNode, EmulatorConfig

from ..conftest import FakeClock
from ..upstream import ServerThread
from .test_serve_e2e import start_gateway

MODEL = "m"
BOTH = ["embeddings", "completions"]


def _node(node_id: str, **knobs: Any) -> EmulatedNode:
    return EmulatedNode(EmulatorConfig(node_id=node_id, model=MODEL, start=0, end=39,
                                       layers=40, tps=400.0, embedding_dim=16, **knobs))


def _register(gw: str, node: EmulatedNode, url: str, tps: float,
              caps: list[str] | None) -> None:
    record: dict[str, Any] = {"node_id": node.config.node_id, "model": MODEL, "start": 0,
                              "end": 39, "layers": 40, "url": url, "tps": tps}
    if caps is not None:
        record["caps"] = caps
    resp = httpx.post(f"{gw}/v1/nodes", json=record)
    assert resp.status_code in (200, 201), resp.text


@pytest.fixture
def mesh() -> Iterator[dict[str, Any]]:
    """Three whole-model nodes: `broken` (declares both, ranked first by its prior, answers
    500), `good` (declares both), `plain` (declares neither: chat only)."""
    nodes = {"broken": _node("broken", fail_share=1.0), "good": _node("good"),
             "plain": _node("plain")}
    clock = FakeClock()
    with ExitStack() as stack:
        urls = {name: stack.enter_context(ServerThread(n.app())).url
                for name, n in nodes.items()}
        server, gateway = start_gateway(clock=clock)
        stack.enter_context(server)
        _register(server.url, nodes["broken"], urls["broken"], 1000.0, BOTH)
        _register(server.url, nodes["good"], urls["good"], 50.0, BOTH)
        _register(server.url, nodes["plain"], urls["plain"], 20.0, None)
        yield {"url": server.url, "gateway": gateway, "clock": clock, **nodes}


def _client(mesh: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=mesh["url"] + "/v1", api_key="unused", max_retries=0)


def _served(node: EmulatedNode) -> int:
    return node.worker.requests_total


def test_embeddings_fall_back_past_a_500_and_skip_a_route_without_the_capability(
        mesh: dict[str, Any]) -> None:
    client = _client(mesh)
    raw = client.embeddings.with_raw_response.create(model=MODEL, input=["alpha", "beta"])
    got = raw.parse()
    assert raw.headers["x-meshroute-route"] == "m|good[0-39]"
    for data, text in zip(got.data, ("alpha", "beta"), strict=True):  # float32 over base64
        assert data.embedding == pytest.approx(vector(text, 16), abs=1e-6)
    assert got.usage.prompt_tokens == 2
    for _ in range(3):
        client.embeddings.create(model=MODEL, input="again", encoding_format="float")
    assert _served(mesh["plain"]) == 0  # never sent an embeddings request
    table = httpx.get(mesh["url"] + "/v1/routing").json()
    rows = {r["head"]: r for r in table["embeddings"]["models"][MODEL]["candidates"]}
    assert set(rows) == {"broken", "good"}  # `plain` is no embeddings candidate at all
    assert rows["broken"]["failures"] >= 1 and rows["broken"]["successes"] == 0
    assert rows["good"]["successes"] == 4 and rows["good"]["samples"] == 4
    assert rows["good"]["inputs_per_s"] > 0 and rows["good"]["latency_ms"] is not None
    chat_rows = table["models"][MODEL]["candidates"]
    assert all(r["successes"] == 0 and r["failures"] == 0 for r in chat_rows)
    # its events say so: the dashboard charts no inputs/s as tok/s
    outcomes = [e for e in mesh["gateway"].telemetry.events.history(0)
                if e["type"] == "outcome"]
    assert outcomes and all(e["kind"] == "embeddings" for e in outcomes)
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "x"}])
    chat = [e for e in mesh["gateway"].telemetry.events.history(0) if e["type"] == "outcome"]
    assert "kind" not in chat[-1]


def test_embeddings_statistics_leave_chat_tokens_per_s_alone(mesh: dict[str, Any]) -> None:
    client = _client(mesh)
    client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                   max_tokens=12)
    before = httpx.get(mesh["url"] + "/v1/routing").json()["models"][MODEL]["candidates"]
    for _ in range(4):
        client.embeddings.create(model=MODEL, input=["a", "b", "c"])
    # another query than the first: not served from /v1/routing's one-second cache
    after = httpx.get(mesh["url"] + "/v1/routing?model=m").json()
    chat = {r["signature"]: r for r in after["models"][MODEL]["candidates"]}
    for row in before:
        now = chat[row["signature"]]
        assert (now["samples"], now["successes"], now["failures"]) == (
            row["samples"], row["successes"], row["failures"])
        if row["tps"] is not None:
            assert now["tps"] == pytest.approx(row["tps"], rel=1e-3)
    embedded = after["embeddings"]["models"][MODEL]["candidates"]
    assert sum(r["samples"] for r in embedded) == 4


def test_completions_stream_and_not_with_fallback(mesh: dict[str, Any]) -> None:
    client = _client(mesh)
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="say", max_tokens=9)
    whole = raw.parse()
    assert raw.headers["x-meshroute-route"] == "m|good[0-39]"
    assert whole.choices[0].text == "".join(words(9))
    stream = client.completions.create(model=MODEL, prompt="say", max_tokens=11, stream=True)
    text = "".join(c.choices[0].text for c in stream if c.choices)
    assert text == "".join(words(11))
    assert _served(mesh["plain"]) == 0
    rows = {r["head"]: r for r in
            httpx.get(mesh["url"] + "/v1/routing").json()["models"][MODEL]["candidates"]}
    # both measured as chat is: tokens (11 streamed `text` deltas, 9 from usage) per second
    assert rows["good"]["samples"] == 2 and rows["good"]["tps"] > 0
    assert rows["broken"]["failures"] >= 1


def test_no_route_with_the_capability_is_a_400(mesh: dict[str, Any]) -> None:
    gw = mesh["url"]
    for node_id in ("broken", "good"):
        assert httpx.delete(f"{gw}/v1/nodes/{node_id}").status_code == 200
    resp = httpx.post(gw + "/v1/embeddings", json={"model": MODEL, "input": "x"})
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["code"] == "unsupported_capability" and "embeddings" in error["message"]
    assert _served(mesh["plain"]) == 0


BAD = [
    ("/v1/embeddings", {"model": MODEL}, "invalid_input"),
    ("/v1/embeddings", {"model": MODEL, "input": []}, "invalid_input"),
    ("/v1/embeddings", {"model": MODEL, "input": ""}, "invalid_input"),
    ("/v1/embeddings", {"model": MODEL, "input": [1, "a"]}, "invalid_input"),
    ("/v1/embeddings", {"model": MODEL, "input": [[1], []]}, "invalid_input"),
    ("/v1/embeddings", {"model": MODEL, "input": [True]}, "invalid_input"),
    ("/v1/embeddings", {"model": MODEL, "input": ["x"] * 2049}, "invalid_input"),
    ("/v1/embeddings", {"model": MODEL, "input": "x", "dimensions": 0}, "invalid_dimensions"),
    ("/v1/embeddings", {"model": MODEL, "input": "x", "encoding_format": "hex"},
     "invalid_encoding_format"),
    ("/v1/embeddings", {"input": "x"}, "invalid_model"),
    ("/v1/completions", {"model": MODEL}, "invalid_prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": {"a": 1}}, "invalid_prompt"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": "9"},
     "invalid_max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "max_tokens": 0},
     "invalid_max_tokens"),
    ("/v1/completions", {"model": MODEL, "prompt": "x", "stream": "yes"}, "invalid_stream"),
    ("/v1/completions", [], "invalid_request"),
]


def test_bad_bodies_are_400_json_errors(mesh: dict[str, Any]) -> None:
    for path, body, code in BAD:
        resp = httpx.post(mesh["url"] + path, json=body)
        assert resp.status_code == 400, (path, body)
        error = resp.json()["error"]
        assert error["code"] == code and error["type"] == "invalid_request_error", (path, body)
        assert error["message"]
    resp = httpx.post(mesh["url"] + "/v1/embeddings", content=b"{not json")
    assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_json"
    assert all(_served(mesh[n]) == 0 for n in ("broken", "good", "plain"))
