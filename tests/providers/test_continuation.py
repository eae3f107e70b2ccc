"""Mid-stream failover on provider routes (issue 34): a provider model whose config declares
`continue = true` has a stream that broke after content continued on the next key of the same
model (or another provider's model of the same id), which is sent the partial answer as an
assistant message; in-process, over fake upstreams that continue exactly: an
OpenAI-compatible one and an Anthropic Messages one (a prefill)."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from meshroute_middleware.app.config import GatewayConfig
from meshroute_middleware.app.gateway import Gateway, build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig
from meshroute_middleware.core.clients import Client
from meshroute_middleware.core.providers.config import parse_providers_config
from meshroute_middleware.forwarding.client import ForwardTimeouts
from meshroute_middleware.forwarding.memory import ASGIForwarder

from ..conftest import FakeClock
from .gateway import ENV
from .test_client_spend import H_TEST_CLIENT, as_client

pytestmark = pytest.mark.anyio
WORDS = [f"word{i} " for i in range(20)]
TEXT = "".join(WORDS)
PARTIAL = "".join(WORDS[:5])
FAST, OTHER = "http://127.0.0.1:9101", "http://127.0.0.1:9102"
FIRST, SECOND = "fastco/big-model#1", "fastco/big-model#2"
PRICE_IN, PRICE_OUT = 2.0, 8.0


def _event(data: dict[str, Any], name: str | None = None) -> bytes:
    head = b"" if name is None else f"event: {name}\n".encode()
    return head + b"data: " + json.dumps(data).encode() + b"\n\n"


@dataclass
class ChatUpstream:
    """An OpenAI-compatible provider whose answer is TEXT, word by word; given a trailing
    assistant message (a prefix of TEXT) it answers the rest exactly. Its first request dies
    `die_after` words into its answer (None: never); `tool_call`: its answers begin with
    one."""

    die_after: int | None = 5
    tool_call: bool = False
    die_again: int | None = None  # its second request dies this many words in
    echo: bool = False  # a continuation repeats the prefill first, in two pieces
    stall: bool = False  # its first request stalls (rather than dies) `die_after` words in
    refuse_prefill: int = 0  # this many requests with a trailing assistant message get a 400
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (key, body)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.seen.append((request.headers.get("authorization", "")[7:], body))
        last = body["messages"][-1]
        done = last["content"] if last["role"] == "assistant" else ""
        if done and self.refuse_prefill:
            self.refuse_prefill -= 1
            return JSONResponse({"error": {"message": "no prefill", "type": "x"}}, 400)
        assert TEXT.startswith(done), f"{done!r} is not how the answer begins"
        rest = WORDS[len(done.split()):]
        if self.echo and done:
            rest = [done[:4], done[4:], *rest]
        usage = {"prompt_tokens": 10 + len(done.split()), "completion_tokens": len(rest),
                 "total_tokens": 10 + len(done.split()) + len(rest)}
        if not body.get("stream"):
            return JSONResponse({"id": "whole", "object": "chat.completion", "created": 1,
                                 "model": body["model"], "usage": usage, "choices": [{
                                     "index": 0, "finish_reason": "stop", "message": {
                                         "role": "assistant", "content": "".join(rest)}}]})
        dies = {1: self.die_after, 2: self.die_again}.get(len(self.seen))
        return StreamingResponse(self._stream(len(self.seen), rest, usage, dies),
                                 media_type="text/event-stream")

    async def _stream(self, n: int, rest: list[str], usage: dict[str, int],
                      dies: int | None) -> AsyncIterator[bytes]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return _event({"id": f"id-{n}", "object": "chat.completion.chunk", "created": n,
                           "model": f"m-{n}", "choices": [
                               {"index": 0, "delta": delta, "finish_reason": finish}]})

        yield chunk({"role": "assistant", "content": None})
        if self.tool_call:
            yield chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                         "function": {"name": "f", "arguments": "{\"a\""}}]})
        for i, word in enumerate(rest):
            if i == dies and self.stall and n == 1:
                await asyncio.sleep(600)  # cut by the gateway's idle bound long before
            if i == dies:
                raise ConnectionError("emulated death mid-stream")
            await asyncio.sleep(0)
            yield chunk({"content": word})
        yield chunk({}, "stop")
        yield _event({"id": f"id-{n}", "object": "chat.completion.chunk", "created": n,
                      "model": "m", "choices": [], "usage": usage})
        yield b"data: [DONE]\n\n"


@dataclass
class MessagesUpstream:
    """An Anthropic Messages provider whose answer is TEXT; given a trailing assistant turn
    (a prefill: a prefix of TEXT), it answers the rest exactly, and refuses a prefill that
    ends in whitespace as Anthropic does. Its first request dies `die_after` pieces in."""

    die_after: int | None = 5
    seen: list[tuple[str, dict[str, Any]]] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/messages", self.messages, methods=["POST"])])

    async def messages(self, request: Request) -> Response:
        body = await request.json()
        self.seen.append((request.headers.get("x-api-key", ""), body))
        last = body["messages"][-1]
        done = ""
        if last["role"] == "assistant":
            content = last["content"]
            done = content if isinstance(content, str) else "".join(b["text"] for b in content)
            if done != done.rstrip():
                return JSONResponse({"type": "error", "error": {
                    "type": "invalid_request_error", "message": "messages: final assistant "
                    "content cannot end with trailing whitespace"}}, 400)
        assert TEXT.startswith(done), f"{done!r} is not how the answer begins"
        pieces = re.findall(r"\S+\s*|\s+", TEXT[len(done):])
        assert body.get("stream") is True
        dies = self.die_after if len(self.seen) == 1 else None
        return StreamingResponse(self._events(body, pieces, dies),
                                 media_type="text/event-stream")

    async def _events(self, body: dict[str, Any], pieces: list[str],
                      dies: int | None) -> AsyncIterator[bytes]:
        made = len("".join(pieces).split())
        yield _event({"type": "message_start", "message": {
            "id": f"msg_{len(self.seen)}", "type": "message", "role": "assistant",
            "model": body["model"], "content": [], "stop_reason": None,
            "usage": {"input_tokens": 10, "output_tokens": 1}}}, "message_start")
        yield _event({"type": "content_block_start", "index": 0,
                      "content_block": {"type": "text", "text": ""}}, "content_block_start")
        for i, piece in enumerate(pieces):
            if i == dies:
                raise ConnectionError("emulated death mid-stream")
            await asyncio.sleep(0)
            yield _event({"type": "content_block_delta", "index": 0,
                          "delta": {"type": "text_delta", "text": piece}},
                         "content_block_delta")
        yield _event({"type": "content_block_stop", "index": 0}, "content_block_stop")
        yield _event({"type": "message_delta", "delta": {"stop_reason": "end_turn",
                                                         "stop_sequence": None},
                      "usage": {"output_tokens": made}}, "message_delta")
        yield _event({"type": "message_stop"}, "message_stop")


def model(api: str = "openai", continues: bool | None = True,
          model_id: str = "big-model") -> dict[str, Any]:
    out: dict[str, Any] = {"id": model_id, "tier": "large", "context": 4096, "api": api,
                           "price_in": PRICE_IN, "price_out": PRICE_OUT}
    if continues is not None:
        out["continue"] = continues
    return out


def doc(*, api: str = "openai", continues: bool | None = True, keys: int = 2,
        more: list[dict[str, Any]] | None = None,
        chain: tuple[str, ...] = ("fastco/big-model",)) -> dict[str, Any]:
    return {"routing": {"chain": list(chain), "strategy": "priority"},
            "providers": [{"name": "fastco", "base_url": f"{FAST}/v1", "cache_ttl": 0,
                           "keys": ["env:FAST_A", "env:FAST_B", "env:SLOW_A"][:keys],
                           "models": [model(api, continues)]}, *(more or [])]}


@contextlib.asynccontextmanager
async def gateway(config: dict[str, Any], apps: dict[str, Any],
                  clients: list[Client] = (), idle_s: float = 30.0
                  ) -> AsyncIterator[tuple[Gateway, httpx.AsyncClient]]:
    settings = ServeSettings(mdns=False, seed=3, router=RouterConfig(explore_share=0.0),
                             first_byte_timeout_s=5.0, state_file=":memory:",
                             providers=parse_providers_config(config))
    gw = build_gateway(GatewayConfig.build(settings, ENV), clock=FakeClock(1_796_040_000.0),
                       forwarder=ASGIForwarder({u: a.app() for u, a in apps.items()},
                                               ForwardTimeouts(first_byte_s=5.0,
                                                               idle_s=idle_s)))
    app = as_client(gw.app, {c.name: c for c in clients}) if clients else gw.app
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                     base_url="http://gw", timeout=30) as client:
            yield gw, client
    finally:
        if gw.store is not None:
            gw.store.close()


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def streamed_text(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                   if c.get("choices"))


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "fastco/big-model", "messages": [{"role": "user", "content": "count"}],
            **extra}


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_a_stream_killed_after_5_of_20_words_goes_on_on_the_next_key(api: str) -> None:
    upstream = ChatUpstream() if api == "openai" else MessagesUpstream()
    async with gateway(doc(api=api), {FAST: upstream}) as (gw, client):
        resp = await client.post("/v1/chat/completions", json=chat(
            stream=True, stream_options={"include_usage": True}))
    assert resp.status_code == 200
    chunks = events(resp.text)
    assert not any("error" in c for c in chunks)
    assert streamed_text(chunks) == TEXT  # no word repeated or missing
    assert len({c["id"] for c in chunks}) == 1  # one id
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]) == 1
    assert sum(1 for c in chunks if c["choices"]
               and c["choices"][0]["delta"].get("role")) == 1
    assert resp.text.rstrip().endswith("data: [DONE]")
    # the switch is visible: an SSE comment, the meshroute field of the last chunks
    assert f": meshroute: {FIRST} failed mid-stream (stream); the answer continues on " \
           f"{SECOND}" in resp.text
    finish = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
    assert finish["meshroute"] == {"attempts": 2, "routes": [FIRST, SECOND]}
    usage = chunks[-1]["usage"]  # the continuation's plus the dead attempt's
    assert chunks[-1]["meshroute"]["attempts"] == 2
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    assert resp.headers["x-meshroute-route"] == FIRST
    # the next key received the partial answer as an assistant message
    (key_a, _), (key_b, continued) = upstream.seen
    assert {key_a, key_b} == {ENV["FAST_A"], ENV["FAST_B"]}
    if api == "openai":
        assert usage["completion_tokens"] == 20
        assert continued["messages"] == [{"role": "user", "content": "count"},
                                         {"role": "assistant", "content": PARTIAL}]
    else:  # a prefill, without the trailing whitespace Messages refuses
        assert continued["messages"][-1] == {"role": "assistant", "content": [
            {"type": "text", "text": PARTIAL.rstrip()}]}
    failovers = [e for e in gw.telemetry.events.history() if e["type"] == "failover"]
    assert [(e["from"], e["to"]) for e in failovers] == [(FIRST, SECOND)]


@pytest.mark.parametrize("api", ["openai", "anthropic"])
async def test_without_streaming_the_answer_is_whole_too(api: str) -> None:
    upstream = ChatUpstream() if api == "openai" else MessagesUpstream()
    async with gateway(doc(api=api), {FAST: upstream}) as (_, client):
        resp = await client.post("/v1/chat/completions", json=chat())
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["object"] == "chat.completion"
    assert answer["choices"][0]["message"]["content"] == TEXT
    assert answer["choices"][0]["finish_reason"] == "stop"
    assert answer["meshroute"] == {"attempts": 2, "routes": [FIRST, SECOND]}
    assert resp.headers["x-meshroute-attempts"] == "2"
    assert resp.headers["x-meshroute-tried"] == f"{FIRST},{SECOND}"
    assert len(upstream.seen) == 2
    if api == "openai":
        assert answer["usage"]["completion_tokens"] == 20
        assert upstream.seen[1][1]["messages"][-1] == {"role": "assistant", "content": PARTIAL}


@pytest.mark.parametrize("continues", [False, None])
async def test_a_model_that_does_not_declare_continue_ends_with_the_error_event(
        continues: bool | None) -> None:
    upstream = ChatUpstream()
    async with gateway(doc(continues=continues), {FAST: upstream}) as (_, client):
        resp = await client.post("/v1/chat/completions", json=chat(stream=True))
        assert resp.status_code == 200
        chunks = events(resp.text)
        assert chunks[-1]["error"]["code"] == "upstream_failed"
        assert streamed_text(chunks[:-1]) == PARTIAL
        whole = await client.post("/v1/chat/completions", json=chat())
        assert whole.status_code == 200
    assert len(upstream.seen) == 2
    assert "stream" not in upstream.seen[1][1]  # not gathered from a stream: as it was sent


async def test_a_tool_call_stream_ends_with_the_error_event() -> None:
    upstream = ChatUpstream(tool_call=True)
    async with gateway(doc(), {FAST: upstream}) as (_, client):
        resp = await client.post("/v1/chat/completions", json=chat(stream=True))
    assert events(resp.text)[-1]["error"]["code"] == "upstream_failed"
    assert len(upstream.seen) == 1


async def test_continue_false_is_honoured() -> None:
    upstream = ChatUpstream()
    async with gateway(doc(), {FAST: upstream}) as (_, client):
        resp = await client.post("/v1/chat/completions", json=chat(
            stream=True, meshroute={"continue": False}))
        assert events(resp.text)[-1]["error"]["code"] == "upstream_failed"
        assert len(upstream.seen) == 1
        whole = await client.post("/v1/chat/completions", json=chat(
            meshroute={"continue": False}))
        assert whole.status_code == 200
    assert "stream" not in upstream.seen[1][1]


async def test_one_key_and_no_other_route_ends_with_the_error_event() -> None:
    upstream = ChatUpstream()
    async with gateway(doc(keys=1), {FAST: upstream}) as (_, client):
        resp = await client.post("/v1/chat/completions", json=chat(stream=True))
    assert events(resp.text)[-1]["error"]["code"] == "upstream_failed"
    assert len(upstream.seen) == 1


async def test_a_stream_stalled_past_the_idle_bound_goes_on_on_the_next_key() -> None:
    upstream = ChatUpstream(stall=True)
    async with gateway(doc(), {FAST: upstream}, idle_s=1.0) as (_, client):
        resp = await client.post("/v1/chat/completions", json=chat(stream=True))
    chunks = events(resp.text)
    assert streamed_text(chunks) == TEXT and not any("error" in c for c in chunks)
    assert upstream.seen[1][1]["messages"][-1] == {"role": "assistant", "content": PARTIAL}


async def test_a_second_death_goes_on_on_the_third_key() -> None:
    upstream = ChatUpstream(die_again=3)
    async with gateway(doc(keys=3), {FAST: upstream}) as (_, client):
        resp = await client.post("/v1/chat/completions", json=chat(
            stream=True, stream_options={"include_usage": True}))
    chunks = events(resp.text)
    assert streamed_text(chunks) == TEXT and not any("error" in c for c in chunks)
    assert chunks[-1]["meshroute"]["routes"] == [FIRST, SECOND, "fastco/big-model#3"]
    assert chunks[-1]["usage"]["completion_tokens"] == 20  # 5 + 3 + the last 12
    assert upstream.seen[2][1]["messages"][-1] == {"role": "assistant",
                                                   "content": "".join(WORDS[:8])}
    assert len({key for key, _ in upstream.seen}) == 3


async def test_a_key_that_refuses_the_continuation_is_passed_for_the_next() -> None:
    upstream = ChatUpstream(refuse_prefill=1)
    async with gateway(doc(keys=3), {FAST: upstream}) as (_, client):
        resp = await client.post("/v1/chat/completions", json=chat(stream=True))
    chunks = events(resp.text)
    assert streamed_text(chunks) == TEXT and not any("error" in c for c in chunks)
    assert chunks[-1]["meshroute"]["routes"] == [FIRST, "fastco/big-model#3"]
    assert len(upstream.seen) == 3


async def test_another_provider_of_the_same_model_continues_and_others_are_passed() -> None:
    """fastco (one key) dies; slowco serves another model and otherco's big-model does not
    declare `continue`: the answer goes on on thirdco's big-model."""
    first, other, third = ChatUpstream(), ChatUpstream(), ChatUpstream(die_after=None)
    more = [{"name": "slowco", "base_url": f"{OTHER}/v1", "keys": ["env:SLOW_A"],
             "models": [model(model_id="small-model")]},
            {"name": "otherco", "base_url": f"{OTHER}/v1", "keys": ["env:SLOW_A"],
             "models": [model(continues=False)]},
            {"name": "thirdco", "base_url": "http://127.0.0.1:9103/v1", "keys": ["env:SLOW_A"],
             "models": [model()]}]
    chain = ("fastco/big-model", "slowco/small-model", "otherco/big-model", "thirdco/big-model")
    async with gateway(doc(keys=1, more=more, chain=chain),
                       {FAST: first, OTHER: other, "http://127.0.0.1:9103": third}) as (_, client):
        resp = await client.post("/v1/chat/completions", json=chat(model="auto", stream=True))
    chunks = events(resp.text)
    assert streamed_text(chunks) == TEXT and not any("error" in c for c in chunks)
    assert other.seen == []
    assert third.seen[0][1]["messages"][-1] == {"role": "assistant", "content": PARTIAL}
    assert third.seen[0][1]["model"] == "big-model"
    assert chunks[-1]["meshroute"]["routes"] == ["fastco/big-model#1", "thirdco/big-model#1"]


@pytest.mark.parametrize("echo", [False, True])
async def test_a_chains_mesh_entry_of_the_same_model_continues_a_provider_stream(
        echo: bool) -> None:
    """fastco's big-model (one key) dies; the chain's mesh model `big-model` goes on, on its
    node's route (a server that may repeat the prefill first, as llama.cpp's does)."""
    first, node_head = ChatUpstream(), ChatUpstream(die_after=None, echo=echo)
    head = "http://127.0.0.1:9104"
    config = doc(keys=1, chain=("fastco/big-model", "big-model"))
    config["mesh"] = {"big-model": {"tier": "large"}}
    async with gateway(config, {FAST: first, head: node_head}) as (gw, client):
        gw.mesh.upsert_raw({"node_id": "n1", "model": "big-model", "start": 0, "end": 39,
                            "layers": 40, "url": head, "tps": 20}, "test")
        resp = await client.post("/v1/chat/completions", json=chat(model="auto", stream=True))
    chunks = events(resp.text)
    assert streamed_text(chunks) == TEXT and not any("error" in c for c in chunks)
    assert node_head.seen[0][1]["messages"][-1] == {"role": "assistant", "content": PARTIAL}
    assert node_head.seen[0][1]["model"] == "big-model"
    assert chunks[-1]["meshroute"]["routes"] == [FIRST,
                                                 "big-model|n1[0-39]"]


async def test_a_chains_mesh_entry_continues_a_provider_answer_not_streamed() -> None:
    """The same without streaming: the answer is gathered (chat/gather.py) on its way to the
    mesh entry, which reads the client's status under the gathering (it asserted a bare
    TallySend: a 500 and the mesh route's decision left open)."""
    first, node_head = ChatUpstream(), ChatUpstream(die_after=None)
    head = "http://127.0.0.1:9104"
    config = doc(keys=1, chain=("fastco/big-model", "big-model"))
    config["mesh"] = {"big-model": {"tier": "large"}}
    async with gateway(config, {FAST: first, head: node_head}) as (gw, client):
        gw.mesh.upsert_raw({"node_id": "n1", "model": "big-model", "start": 0, "end": 39,
                            "layers": 40, "url": head, "tps": 20}, "test")
        resp = await client.post("/v1/chat/completions", json=chat(model="auto"))
        routing = (await client.get("/v1/routing")).json()
    assert resp.status_code == 200, resp.text
    answer = resp.json()
    assert answer["choices"][0]["message"]["content"] == TEXT
    assert answer["meshroute"]["routes"] == [FIRST, "big-model|n1[0-39]"]
    assert node_head.seen[0][1]["messages"][-1] == {"role": "assistant", "content": PARTIAL}
    rows = [r for r in routing.get("routes", []) if r.get("signature", "").startswith("big")]
    assert all(r.get("in_flight", 0) == 0 for r in rows), rows


async def test_a_mesh_route_that_dies_continuing_goes_on_on_the_next_mesh_route() -> None:
    first, dying, last = ChatUpstream(), ChatUpstream(die_after=3), ChatUpstream(die_after=None)
    heads = {"http://127.0.0.1:9104": (dying, 30), "http://127.0.0.1:9105": (last, 10)}
    config = doc(keys=1, chain=("fastco/big-model", "big-model"))
    config["mesh"] = {"big-model": {"tier": "large"}}
    async with gateway(config, {FAST: first, **{u: h for u, (h, _) in heads.items()}}) \
            as (gw, client):
        for i, (url, (_, tps)) in enumerate(heads.items()):
            gw.mesh.upsert_raw({"node_id": f"n{i}", "model": "big-model", "start": 0,
                                "end": 39, "layers": 40, "url": url, "tps": tps}, "test")
        resp = await client.post("/v1/chat/completions", json=chat(model="auto", stream=True))
    chunks = events(resp.text)
    assert streamed_text(chunks) == TEXT and not any("error" in c for c in chunks)
    messages = last.seen[0][1]["messages"]
    assert messages == [{"role": "user", "content": "count"},
                        {"role": "assistant", "content": "".join(WORDS[:8])}]
    assert chunks[-1]["meshroute"]["routes"] == [FIRST, "big-model|n0[0-39]",
                                                 "big-model|n1[0-39]"]


async def test_usage_is_summed_and_charged_to_the_client() -> None:
    alice = Client("alice", hashlib.sha256(b"key-alice").digest(), daily_tokens=100_000)
    async with gateway(doc(), {FAST: ChatUpstream()}, [alice]) as (_, client):
        resp = await client.post("/v1/chat/completions", headers={
            H_TEST_CLIENT.decode(): "alice"}, json=chat(stream=True))
        assert streamed_text(events(resp.text)) == TEXT
        assert not any(c.get("usage") for c in events(resp.text))  # not asked for
        rows = (await client.get("/v1/usage", params={
            "client": "alice", "group_by": "route"})).json()["data"]
    # the continuation read 15 prompt tokens (10 + the 5 words) and made 15; the dead
    # attempt read 10 and made 5
    by_route = {r["route"]: r for r in rows}
    row = by_route["fastco/big-model"]
    assert (row["requests"], row["prompt_tokens"], row["completion_tokens"]) == (1, 25, 20)
    assert row["cost_usd"] == pytest.approx((25 * PRICE_IN + 20 * PRICE_OUT) / 1e6)
    # the continuation's reservation, released: one more upstream request, nothing spent
    reserved = by_route["none"]
    assert (reserved["requests"], reserved["prompt_tokens"], reserved["cost_usd"]) == (1, 0, 0)


@pytest.mark.parametrize(("daily_tokens", "continued"), [(1_000, True), (150, False)])
async def test_a_continuation_is_reserved_against_the_clients_budget_first(
        daily_tokens: int, continued: bool) -> None:
    """The request reserves ~110 tokens (its prompt and max_tokens 100); its continuation
    ~115 more (the prompt, the 5 words, 95): a budget of 150 admits the request, not both."""
    alice = Client("alice", hashlib.sha256(b"key-alice").digest(), daily_tokens=daily_tokens)
    upstream = ChatUpstream()
    async with gateway(doc(), {FAST: upstream}, [alice]) as (_, client):
        resp = await client.post("/v1/chat/completions", headers={
            H_TEST_CLIENT.decode(): "alice"}, json=chat(stream=True, max_tokens=100))
    chunks = events(resp.text)
    assert resp.status_code == 200
    if continued:
        assert streamed_text(chunks) == TEXT and not any("error" in c for c in chunks)
        assert len(upstream.seen) == 2
    else:  # over its budget: not continued, never sent
        assert chunks[-1]["error"]["code"] == "upstream_failed"
        assert len(upstream.seen) == 1


@pytest.mark.parametrize("stream", [True, False])
async def test_messages_clients_get_one_whole_answer(stream: bool) -> None:
    upstream = ChatUpstream()
    async with gateway(doc(), {FAST: upstream}) as (_, client):
        resp = await client.post("/v1/messages", json={
            "model": "fastco/big-model", "max_tokens": 100, "stream": stream,
            "messages": [{"role": "user", "content": "count"}]})
    assert resp.status_code == 200, resp.text
    assert upstream.seen[1][1]["messages"][-1] == {"role": "assistant", "content": PARTIAL}
    if not stream:
        assert resp.json()["content"][0]["text"] == TEXT
        return
    got = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: ")]
    kinds = [e["type"] for e in got]
    assert kinds.count("message_start") == 1 and kinds.count("message_stop") == 1
    assert "error" not in kinds
    assert "".join(e["delta"].get("text", "") for e in got
                   if e["type"] == "content_block_delta") == TEXT


@pytest.mark.parametrize("stream", [True, False])
async def test_responses_clients_get_one_whole_answer(stream: bool) -> None:
    upstream = ChatUpstream()
    async with gateway(doc(), {FAST: upstream}) as (_, client):
        resp = await client.post("/v1/responses", json={
            "model": "fastco/big-model", "input": "count", "stream": stream})
    assert resp.status_code == 200, resp.text
    assert upstream.seen[1][1]["messages"][-1] == {"role": "assistant", "content": PARTIAL}
    if not stream:
        assert resp.json()["output"][0]["content"][0]["text"] == TEXT
        return
    got = [json.loads(line[6:]) for line in resp.text.splitlines() if line.startswith("data: ")]
    kinds = [e["type"] for e in got]
    assert kinds.count("response.completed") == 1 and "response.failed" not in kinds
    assert "".join(e["delta"] for e in got if e["type"] == "response.output_text.delta") \
        == TEXT
