"""/v1/embeddings and /v1/completions over provider routes (and a chain's mesh entry): the
official openai client against a real gateway and fake providers declaring `capabilities`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from node_agent.embeddings import vector
from node_agent.emulator import EmulatedNode, EmulatorConfig

from ..upstream import ServerThread
from .fake_provider import FakeProvider, Reply
from .gateway import Running, gateway

BOTH = ["embeddings", "completions"]


@pytest.fixture
def three() -> Iterator[dict[str, FakeProvider]]:
    """fastco (frontier: ranked first), slowco (small) declare both; plainco declares none."""
    ps = {"fast": FakeProvider("fast"), "slow": FakeProvider("slow", models=("small-model",)),
          "plain": FakeProvider("plain", models=("plain-model",))}
    with ps["fast"].serve(), ps["slow"].serve(), ps["plain"].serve():
        yield ps


def _doc(ps: dict[str, FakeProvider], chain: list[str] | None = None,
         mesh: dict[str, Any] | None = None) -> dict[str, Any]:
    def provider(name: str, p: FakeProvider, model: str, tier: str,
                 caps: list[str] | None, key: str) -> dict[str, Any]:
        entry: dict[str, Any] = {"id": model, "tier": tier, "context": 4096}
        if caps is not None:
            entry["capabilities"] = caps
        return {"name": name, "base_url": p.base_url, "keys": [f"env:{key}"],
                "models": [entry]}
    doc: dict[str, Any] = {
        "routing": {"strategy": "smartest",
                    "chain": chain or ["fastco/big-model", "plainco/plain-model",
                                       "slowco/small-model"]},
        "providers": [provider("fastco", ps["fast"], "big-model", "frontier", BOTH, "FAST_A"),
                      provider("plainco", ps["plain"], "plain-model", "large", None, "FAST_B"),
                      provider("slowco", ps["slow"], "small-model", "small", BOTH, "SLOW_A")]}
    if mesh:
        doc["mesh"] = mesh
    return doc


def _client(gw: Running) -> openai.OpenAI:
    return openai.OpenAI(base_url=gw.url + "/v1", api_key="unused", max_retries=0)


def test_embeddings_fall_back_to_the_next_provider_declaring_them(
        three: dict[str, FakeProvider]) -> None:
    three["fast"].push(Reply.error(500))
    with gateway(_doc(three)) as gw:
        raw = _client(gw).embeddings.with_raw_response.create(
            model="auto", input=["one", "two"], encoding_format="float")
        again = _client(gw).embeddings.create(model="slowco/small-model", input="x")
        chat_stats = dict(gw.gateway.providers.stats) if gw.gateway.providers else {}
        table = httpx.get(gw.url + "/v1/routing").json()
        events = [e for e in gw.gateway.telemetry.events.history(0) if e["type"] == "outcome"]
    assert {e["signature"] for e in events} == {"fastco/big-model#1", "slowco/small-model#1"}
    assert all(e["kind"] == "embeddings" for e in events)  # tps there is inputs/s
    got = raw.parse()
    assert raw.headers["x-meshroute-tried"] == "fastco/big-model#1,slowco/small-model#1"
    assert raw.headers["x-meshroute-route"] == "slowco/small-model#1"
    assert [d.embedding for d in got.data] == [vector("one", 8), vector("two", 8)]
    assert len(again.data) == 1
    assert [s.path for s in three["fast"].seen] == ["/v1/embeddings"]
    assert [s.path for s in three["slow"].seen] == ["/v1/embeddings"] * 2
    assert three["slow"].seen[0].model == "small-model"  # the upstream's own model id
    assert three["plain"].seen == []  # never sent what it did not declare
    # measured in the embeddings' own provider statistics: inputs/s and latency ...
    measured = table["embeddings"]["providers"]
    assert measured["slowco/small-model"]["successes"] == 2
    assert measured["slowco/small-model"]["inputs_per_s"] > 0
    assert measured["slowco/small-model"]["latency_ms"] > 0
    assert measured["fastco/big-model"]["failures"] == 1
    # ... and none of it in chat's: its ranking and speed axes untouched
    assert "slowco/small-model" not in chat_stats and "fastco/big-model" not in chat_stats


@pytest.mark.parametrize("stream", [False, True])
def test_completions_fall_back_stream_and_not(three: dict[str, FakeProvider],
                                              stream: bool) -> None:
    three["fast"].push(Reply.error(503))
    three["slow"].default = Reply(tokens=10)
    with gateway(_doc(three)) as gw:
        raw = _client(gw).completions.with_raw_response.create(
            model="auto", prompt="say", max_tokens=10, stream=stream)
        parsed = raw.parse()
        if isinstance(parsed, openai.Stream):
            text = "".join(c.choices[0].text for c in parsed if c.choices)
        else:
            text = parsed.choices[0].text
        stats = gw.gateway.providers.stats if gw.gateway.providers else {}
    assert raw.headers["x-meshroute-tried"] == "fastco/big-model#1,slowco/small-model#1"
    assert text == "".join(f"t{i} " for i in range(10))
    assert [s.path for s in three["fast"].seen] == ["/v1/completions"]
    assert [s.path for s in three["slow"].seen] == ["/v1/completions"]
    assert three["plain"].seen == []
    assert stats["slowco/small-model"].tokens_per_s is not None  # measured like chat


def test_a_provider_model_without_the_capability_is_a_400(
        three: dict[str, FakeProvider]) -> None:
    with gateway(_doc(three)) as gw:
        resp = httpx.post(gw.url + "/v1/embeddings",
                          json={"model": "plainco/plain-model", "input": "x"})
        chat = gw.chat("plainco/plain-model")
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "unsupported_capability"
    assert "embeddings" in resp.json()["error"]["message"]
    assert chat.status_code == 200  # the same route still takes chat
    assert [s.path for s in three["plain"].seen] == ["/v1/chat/completions"]


def test_a_chains_mesh_entry_serves_embeddings_with_their_own_statistics(
        three: dict[str, FakeProvider]) -> None:
    node = EmulatedNode(EmulatorConfig(node_id="n1", model="qwen", start=0, end=39,
                                       layers=40, tps=400.0, embedding_dim=8))
    plain = EmulatedNode(EmulatorConfig(node_id="p1", model="plainq", start=0, end=39,
                                        layers=40, tps=400.0))
    doc = _doc(three, chain=["plainq", "qwen", "slowco/small-model"],
               mesh={"qwen": {"tier": "frontier"}, "plainq": {"tier": "frontier"}})
    with ServerThread(node.app()) as head, ServerThread(plain.app()) as other, \
            gateway(doc) as gw:
        for node_id, model, url, caps in (("n1", "qwen", head.url, BOTH),
                                          ("p1", "plainq", other.url, None)):
            record: dict[str, Any] = {"node_id": node_id, "model": model, "start": 0,
                                      "end": 39, "layers": 40, "url": url, "tps": 10}
            if caps:
                record["caps"] = caps
            assert httpx.post(f"{gw.url}/v1/nodes", json=record).status_code in (200, 201)
        raw = _client(gw).embeddings.with_raw_response.create(
            model="auto", input="hello", encoding_format="float")
        table = httpx.get(f"{gw.url}/v1/routing").json()
    assert raw.headers["x-meshroute-route"] == "qwen|n1[0-39]"
    assert raw.parse().data[0].embedding == vector("hello", 8)
    assert plain.worker.requests_total == 0 and three["slow"].seen == []
    assert table["embeddings"]["models"]["qwen"]["candidates"][0]["samples"] == 1
    assert all(r["successes"] == 0 for r in table["models"]["qwen"]["candidates"])
    # the chain's view of its mesh entry: in the embeddings' provider statistics alone
    assert table["embeddings"]["providers"]["qwen"]["inputs_per_s"] > 0
    assert "qwen" not in (gw.gateway.providers.stats if gw.gateway.providers else {})


def test_an_alias_maps_an_openai_embedding_model_name_onto_a_provider_model(
        three: dict[str, FakeProvider]) -> None:
    """A RAG pipeline asks for OpenAI's model names; `[aliases]` maps them, and the answer
    names the model asked for."""
    doc = _doc(three)
    doc["aliases"] = {"text-embedding-3-*": "slowco/small-model"}
    with gateway(doc) as gw:
        raw = _client(gw).embeddings.with_raw_response.create(
            model="text-embedding-3-small", input="hi", encoding_format="float")
    got = raw.parse()
    assert got.model == "text-embedding-3-small"
    assert got.data[0].embedding == vector("hi", 8)
    assert [s.model for s in three["slow"].seen] == ["small-model"]
