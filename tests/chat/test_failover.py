"""Mid-stream failover (issue 34): a stream whose route dies after content reached the client
goes on on the next route, which is sent the partial answer as an assistant message; in-process,
over heads that continue a trailing assistant message exactly."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from meshroute_middleware.chat.continuation import Transcript, partial_of
from meshroute_middleware.core.contracts.txt import decode_node, encode_node
from meshroute_middleware.core.errors import InvalidNodeError
from meshroute_middleware.core.topology import parse_node
from meshroute_middleware.forwarding.memory import ASGIForwarder
from node_agent.cli import node_record, node_settings

from .test_forward import Mesh, node

pytestmark = pytest.mark.anyio
WORDS = [f"word{i} " for i in range(20)]
TEXT = "".join(WORDS)
PROMPT = "Count: "


@dataclass
class Continuer:
    """A chat (and completions) server whose answer is always TEXT, word by word; given a
    trailing assistant message (or a prompt PROMPT + a prefix of TEXT), it answers the rest
    of TEXT exactly, as llama.cpp's server continues a prefill. `die_after` words into an
    answer it drops the connection; `tool_call` makes its first chunk a tool call."""

    name: str
    die_after: int | None = None
    tool_call: bool = False
    refuse_prefill: bool = False  # answer a trailing assistant message with a 400
    echo: bool = False  # repeat a prefill before the new text, as llama.cpp's server does
    delay_s: float = 0.0  # before its answer's head (a slow first byte)
    seen: list[dict[str, Any]] = field(default_factory=list)

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"]),
                                 Route("/v1/completions", self.chat, methods=["POST"])])

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.seen.append(body)
        await asyncio.sleep(self.delay_s)
        completions = "prompt" in body
        if completions:
            done = body["prompt"].removeprefix(PROMPT)
        else:
            last = body["messages"][-1]
            done = last["content"] if last["role"] == "assistant" else ""
            if done and self.refuse_prefill:
                return JSONResponse({"error": {"message": "no prefill", "type": "x"}}, 400)
        assert TEXT.startswith(done), f"{done!r} is not how the answer begins"
        rest = WORDS[len(done.split()):]
        if self.echo and done and not completions:
            rest = [done[:4], done[4:], *rest]  # the prefill, in two pieces, then the rest
        usage = {"prompt_tokens": 10 + len(done.split()), "completion_tokens": len(rest),
                 "total_tokens": 10 + len(done.split()) + len(rest)}
        if not body.get("stream"):
            return JSONResponse(self._whole(rest, usage, completions))
        return StreamingResponse(self._stream(body, rest, usage, completions),
                                 media_type="text/event-stream")

    def _whole(self, rest: list[str], usage: dict[str, int],
               completions: bool) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0, "finish_reason": "stop"}
        if completions:
            choice["text"] = "".join(rest)
        else:
            choice["message"] = {"role": "assistant", "content": "".join(rest)}
        return {"id": f"id-{self.name}", "object": "chat.completion", "created": 1,
                "model": "m", "choices": [choice], "usage": usage}

    async def _stream(self, body: dict[str, Any], rest: list[str], usage: dict[str, int],
                      completions: bool) -> AsyncIterator[bytes]:
        def event(delta: dict[str, Any], finish: str | None = None,
                  **more: Any) -> bytes:
            choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
            if completions:
                choice["text"] = delta.get("content", "")
            else:
                choice["delta"] = delta
            data = {"id": f"id-{self.name}", "object": "chat.completion.chunk",
                    "created": hash(self.name) % 1000, "model": f"m-{self.name}",
                    "choices": [choice], **more}
            return b"data: " + json.dumps(data).encode() + b"\n\n"

        if not completions:
            yield event({"role": "assistant", "content": None})
        if self.tool_call:
            yield event({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                         "function": {"name": "f", "arguments": "{\"a\""}}]})
        for i, word in enumerate(rest):
            if self.die_after is not None and i == self.die_after:
                raise ConnectionError("emulated death mid-stream")
            await asyncio.sleep(0)
            yield event({"content": word})
        yield event({}, "stop")
        if (body.get("stream_options") or {}).get("include_usage"):
            data = {"id": f"id-{self.name}", "object": "chat.completion.chunk", "created": 0,
                    "model": "m", "choices": [], "usage": usage}
            yield b"data: " + json.dumps(data).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"


def mesh_of(first: Continuer, second: Continuer, **settings: Any) -> Mesh:
    mesh = Mesh({1: first, 2: second}, **settings)  # type: ignore[dict-item]
    mesh.add(node("a", 0, 39, 1, tps=30), node("b", 0, 39, 2, tps=10))
    return mesh


def events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines()
            if line.startswith("data: {")]


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "count"}], **extra}


@pytest.mark.parametrize("echo", [False, True])
async def test_a_stream_killed_after_5_of_20_words_reaches_the_client_whole(echo: bool) -> None:
    a, b = Continuer("a", die_after=5), Continuer("b", echo=echo)
    mesh = mesh_of(a, b)
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions",
                                 json=chat(stream=True, stream_options={"include_usage": True}))
        assert resp.status_code == 200
        chunks = events(resp.text)
        assert not any("error" in c for c in chunks)
        text = "".join(c["choices"][0]["delta"].get("content") or ""
                       for c in chunks if c["choices"])
        assert text == TEXT  # no word repeated or missing
        assert {c["id"] for c in chunks} == {"id-a"}  # one id
        assert {c["model"] for c in chunks} == {"m-a"}
        assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]) == 1
        assert sum(1 for c in chunks if c["choices"]
                   and c["choices"][0]["delta"].get("role")) == 1  # one role chunk
        assert resp.text.rstrip().endswith("data: [DONE]")
        # the switch is visible: an SSE comment and the meshroute field of the last chunks
        assert ": meshroute: m|a[0-39] failed mid-stream (stream); the answer continues on " \
               "m|b[0-39]" in resp.text
        finish = next(c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"])
        assert finish["meshroute"] == {"attempts": 2, "routes": ["m|a[0-39]", "m|b[0-39]"]}
        usage = chunks[-1]["usage"]  # the continuation's plus the dead attempt's
        assert usage["completion_tokens"] == (22 if echo else 20)  # what b says it made
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        assert chunks[-1]["meshroute"]["attempts"] == 2
    # the next route received the partial answer as an assistant message
    assert b.seen[0]["messages"] == [{"role": "user", "content": "count"},
                                     {"role": "assistant", "content": "".join(WORDS[:5])}]
    failovers = [e for e in mesh.gateway.telemetry.events.history() if e["type"] == "failover"]
    assert [(e["from"], e["to"], e["error"]) for e in failovers] == [
        ("m|a[0-39]", "m|b[0-39]", "stream")]
    metrics = mesh.gateway.telemetry.render().decode()
    assert 'meshroute_failovers_total{model="m"} 1.0' in metrics


async def test_usage_the_client_did_not_ask_for_stays_out() -> None:
    mesh = mesh_of(Continuer("a", die_after=5), Continuer("b"))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(stream=True))
        chunks = events(resp.text)
        assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == TEXT
        assert not any(c.get("usage") for c in chunks)
        assert chunks[-1]["meshroute"]["routes"] == ["m|a[0-39]", "m|b[0-39]"]


async def test_the_dead_route_is_recorded_as_failed_and_the_next_as_answered() -> None:
    mesh = mesh_of(Continuer("a", die_after=5), Continuer("b"))
    async with mesh.client() as client:
        await client.post("/v1/chat/completions", json=chat(stream=True))
        rows = {r["signature"]: r for r in
                (await client.get("/v1/routing")).json()["models"]["m"]["candidates"]}
    assert rows["m|a[0-39]"]["last_error"] == "stream"
    assert rows["m|b[0-39]"]["samples"] == 1 and rows["m|b[0-39]"]["failures"] == 0
    assert all(r["in_flight"] == 0 for r in rows.values())


@pytest.mark.parametrize("extra", [{"meshroute": {"continue": False}},
                                   {"meshroute": {"continue": False, "objective": "ttft"}}])
async def test_continue_false_ends_with_the_error_event(extra: dict[str, Any]) -> None:
    a, b = Continuer("a", die_after=5), Continuer("b")
    mesh = mesh_of(a, b)
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(stream=True, **extra))
        assert resp.status_code == 200
        assert events(resp.text)[-1]["error"]["code"] == "upstream_failed"
    assert b.seen == [] and "meshroute" not in a.seen[0]


async def test_a_bad_continue_option_is_a_400() -> None:
    mesh = mesh_of(Continuer("a"), Continuer("b"))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions",
                                 json=chat(meshroute={"continue": "no"}))
        assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_request"


async def test_a_tool_call_stream_ends_with_the_error_event() -> None:
    a, b = Continuer("a", die_after=5, tool_call=True), Continuer("b")
    mesh = mesh_of(a, b)
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(stream=True))
        assert events(resp.text)[-1]["error"]["code"] == "upstream_failed"
    assert b.seen == []


async def test_a_route_that_refuses_the_prefill_ends_with_the_error_event() -> None:
    a, b = Continuer("a", die_after=5), Continuer("b", refuse_prefill=True)
    mesh = mesh_of(a, b)
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(stream=True))
        chunks = events(resp.text)
        assert chunks[-1]["error"]["code"] == "upstream_failed"
        assert "".join(c["choices"][0]["delta"].get("content") or ""
                       for c in chunks[:-1]) == "".join(WORDS[:5])
        rows = {r["signature"]: r for r in
                (await client.get("/v1/routing")).json()["models"]["m"]["candidates"]}
    assert rows["m|b[0-39]"]["failures"] == 0  # a refusal says nothing of its speed
    assert all(r["in_flight"] == 0 for r in rows.values())


async def test_a_node_that_cannot_continue_is_passed_over() -> None:
    a, b, c = Continuer("a", die_after=5), Continuer("b"), Continuer("c")
    mesh = Mesh({1: a, 2: b, 3: c})  # type: ignore[dict-item]
    mesh.add(node("a", 0, 39, 1, tps=30), {**node("b", 0, 39, 2, tps=20), "continues": False},
             node("c", 0, 39, 3, tps=10))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(stream=True))
        text = "".join(ch["choices"][0]["delta"].get("content") or ""
                       for ch in events(resp.text))
        assert text == TEXT
    assert b.seen == [] and len(c.seen) == 1


async def test_a_second_death_goes_on_on_the_third_route() -> None:
    a, b = Continuer("a", die_after=5), Continuer("b", die_after=6, echo=True)
    c = Continuer("c", echo=True)
    mesh = Mesh({1: a, 2: b, 3: c})  # type: ignore[dict-item]
    mesh.add(node("a", 0, 39, 1, tps=30), node("b", 0, 39, 2, tps=20),
             node("c", 0, 39, 3, tps=10))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions",
                                 json=chat(stream=True, stream_options={"include_usage": True}))
        chunks = events(resp.text)
        assert "".join(ch["choices"][0]["delta"].get("content") or ""
                       for ch in chunks if ch["choices"]) == TEXT
        assert chunks[-1]["meshroute"]["attempts"] == 3
        assert chunks[-1]["usage"]["completion_tokens"] == 5 + 6 + 13  # a's, b's, c's counts
    assert c.seen[0]["messages"][-1] == {"role": "assistant", "content": "".join(WORDS[:9])}


async def test_completions_continue_the_prompt_exactly() -> None:
    a, b = Continuer("a", die_after=5), Continuer("b")
    mesh = Mesh({1: a, 2: b})  # type: ignore[dict-item]
    caps = ["completions"]
    mesh.add({**node("a", 0, 39, 1, tps=30), "caps": caps},
             {**node("b", 0, 39, 2, tps=10), "caps": caps})
    async with mesh.client() as client:
        resp = await client.post("/v1/completions", json={
            "model": "m", "prompt": PROMPT, "stream": True, "max_tokens": 100})
        chunks = events(resp.text)
        assert "".join(ch["choices"][0]["text"] for ch in chunks) == TEXT
        assert {ch["id"] for ch in chunks} == {"id-a"}
    assert b.seen[0]["prompt"] == PROMPT + "".join(WORDS[:5])
    assert b.seen[0]["max_tokens"] == 95  # the bound less what was delivered


async def test_messages_clients_get_one_whole_answer() -> None:
    mesh = mesh_of(Continuer("a", die_after=5), Continuer("b", echo=True))
    async with mesh.client() as client:
        resp = await client.post("/v1/messages", json={
            "model": "m", "max_tokens": 100, "stream": True,
            "messages": [{"role": "user", "content": "count"}]})
        assert resp.status_code == 200
        kinds = [json.loads(line[6:])["type"] for line in resp.text.splitlines()
                 if line.startswith("data: ")]
        assert kinds.count("message_start") == 1 and kinds.count("message_stop") == 1
        assert "error" not in kinds
        text = "".join(json.loads(line[6:])["delta"].get("text", "")
                       for line in resp.text.splitlines() if line.startswith("data: ")
                       and json.loads(line[6:])["type"] == "content_block_delta")
        assert text == TEXT


async def test_responses_clients_get_one_whole_answer() -> None:
    mesh = mesh_of(Continuer("a", die_after=5), Continuer("b"))
    async with mesh.client() as client:
        resp = await client.post("/v1/responses", json={
            "model": "m", "input": "count", "stream": True})
        assert resp.status_code == 200
        got = [json.loads(line[6:]) for line in resp.text.splitlines()
               if line.startswith("data: ")]
        kinds = [e["type"] for e in got]
        assert kinds.count("response.created") == 1 and kinds.count("response.completed") == 1
        assert "response.failed" not in kinds and "error" not in kinds
        assert "".join(e["delta"] for e in got if e["type"] == "response.output_text.delta") \
            == TEXT
        done = next(e for e in got if e["type"] == "response.completed")
        assert done["response"]["output"][0]["content"][0]["text"] == TEXT


async def test_without_a_second_route_the_stream_ends_as_before() -> None:
    a = Continuer("a", die_after=5)
    mesh = Mesh({1: a})  # type: ignore[dict-item]
    mesh.add(node("a", 0, 39, 1))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(stream=True))
        chunks = events(resp.text)
        assert chunks[-1]["error"]["code"] == "upstream_failed"
        assert "".join(c["choices"][0]["delta"].get("content") or ""
                       for c in chunks[:-1]) == "".join(WORDS[:5])


async def test_an_event_cut_in_half_by_the_death_never_reaches_the_client() -> None:
    """The head splits its events across network chunks and dies half way through its 6th
    word: the client gets whole events only, and no word twice."""
    a, b = Continuer("a"), Continuer("b")
    mesh = mesh_of(a, b)
    original = a._stream

    async def split(*args: Any) -> AsyncIterator[bytes]:
        n = 0
        async for chunk in original(*args):
            if n == 6:  # the role chunk, 5 words, then half of the 6th
                yield chunk[:20]
                raise ConnectionError("emulated death mid-event")
            yield chunk[:7]
            yield chunk[7:]
            n += 1

    a._stream = split  # type: ignore[method-assign]
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(stream=True))
    assert all(line.startswith(("data: {", "data: [DONE]", ": meshroute"))
               for line in resp.text.splitlines() if line)
    assert "".join(c["choices"][0]["delta"].get("content") or ""
                   for c in events(resp.text)) == TEXT
    assert b.seen[0]["messages"][-1]["content"] == "".join(WORDS[:5])


async def test_without_streaming_the_answer_is_whole_too() -> None:
    a, b = Continuer("a", die_after=5), Continuer("b", echo=True)
    mesh = mesh_of(a, b)
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(max_tokens=100))
        assert resp.status_code == 200, resp.text
        assert resp.headers["content-type"] == "application/json"
        assert resp.headers["x-meshroute-attempts"] == "2"
        answer = resp.json()
    assert answer["object"] == "chat.completion" and answer["id"] == "id-a"
    assert answer["choices"] == [{"index": 0, "logprobs": None, "finish_reason": "stop",
                                  "message": {"role": "assistant", "content": TEXT}}]
    assert answer["meshroute"] == {"attempts": 2, "routes": ["m|a[0-39]", "m|b[0-39]"]}
    assert answer["usage"]["completion_tokens"] == 5 + 17  # a's 5 words, b's echo and 15
    # the route was asked for a stream, to know what it said; the next got it as a message
    assert a.seen[0]["stream"] is True and a.seen[0]["max_tokens"] == 100
    assert b.seen[0]["messages"][-1] == {"role": "assistant", "content": "".join(WORDS[:5])}
    assert b.seen[0]["max_tokens"] == 95


async def test_a_whole_answer_not_continued_is_a_502() -> None:
    mesh = mesh_of(Continuer("a", die_after=5), Continuer("b", refuse_prefill=True))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat())
        assert resp.status_code == 502 and resp.json()["error"]["code"] == "upstream_failed"


async def test_completions_without_streaming() -> None:
    a, b = Continuer("a", die_after=5), Continuer("b")
    mesh = Mesh({1: a, 2: b})  # type: ignore[dict-item]
    caps = ["completions"]
    mesh.add({**node("a", 0, 39, 1, tps=30), "caps": caps},
             {**node("b", 0, 39, 2, tps=10), "caps": caps})
    async with mesh.client() as client:
        resp = await client.post("/v1/completions", json={"model": "m", "prompt": PROMPT})
        answer = resp.json()
    assert answer["object"] == "text_completion"
    assert answer["choices"][0]["text"] == TEXT
    assert b.seen[0]["prompt"] == PROMPT + "".join(WORDS[:5])


@pytest.mark.parametrize(("extra", "heads"), [
    ({}, 1),  # no other route to continue on: as it was sent
    ({"meshroute": {"continue": False}}, 2),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, 2),
    ({"n": 2}, 2),
])
async def test_a_request_that_would_not_be_continued_goes_as_it_was_sent(
        extra: dict[str, Any], heads: int) -> None:
    a = Continuer("a")
    mesh = Mesh({1: a, 2: Continuer("b")})  # type: ignore[dict-item]
    mesh.add(*[node("a", 0, 39, 1, tps=30), node("b", 0, 39, 2, tps=10)][:heads])
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(**extra))
        assert resp.status_code == 200
        assert resp.json()["choices"][0]["message"]["content"] == TEXT
    assert "stream" not in a.seen[0]
    assert "x-meshroute-attempts" not in resp.headers


async def test_a_whole_answer_without_a_death_is_the_streams_gathered() -> None:
    a = Continuer("a")
    mesh = mesh_of(a, Continuer("b"))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat())
        answer = resp.json()
    assert answer["choices"][0]["message"] == {"role": "assistant", "content": TEXT}
    assert answer["usage"] == {"prompt_tokens": 10, "completion_tokens": 20,
                               "total_tokens": 30}
    assert "meshroute" not in answer and "x-meshroute-attempts" not in resp.headers


async def test_messages_and_responses_without_streaming() -> None:
    mesh = mesh_of(Continuer("a", die_after=5), Continuer("b", echo=True))
    async with mesh.client() as client:
        resp = await client.post("/v1/messages", json={
            "model": "m", "max_tokens": 100,
            "messages": [{"role": "user", "content": "count"}]})
        assert resp.status_code == 200, resp.text
        assert resp.json()["content"] == [{"type": "text", "text": TEXT}]
        assert resp.json()["type"] == "message"
    mesh = mesh_of(Continuer("a", die_after=5), Continuer("b", echo=True))
    async with mesh.client() as client:
        resp = await client.post("/v1/responses", json={"model": "m", "input": "count"})
        assert resp.status_code == 200, resp.text
        assert resp.json()["output"][0]["content"][0]["text"] == TEXT


def test_a_node_announces_that_it_cannot_continue_and_older_records_can() -> None:
    settings = node_settings({"model": "m", "url": "http://127.0.0.1:1", "continues": False},
                             {})
    record = node_record(settings, "http://127.0.0.1:1", None, 10.0)
    assert record.continues is False and record.to_dict()["continues"] is False
    props = encode_node(record)
    assert props["co"] == "False" and decode_node(props).continues is False
    able = replace(record, continues=True)  # the default: nothing more is announced
    assert "continues" not in able.to_dict() and "co" not in encode_node(able)
    assert decode_node(encode_node(able)).continues is True
    with pytest.raises(InvalidNodeError):
        parse_node({**able.to_dict(), "continues": "maybe"})


async def test_a_stall_past_the_idle_bound_goes_on_on_the_next_route() -> None:
    """The head stops sending after 5 words (and would stay silent for a minute): past the
    forwarder's idle bound between chunks the answer goes on on the next route."""
    a, b = Continuer("a"), Continuer("b")
    original = a._stream

    async def stalls(*args: Any) -> AsyncIterator[bytes]:
        n = 0
        async for chunk in original(*args):
            if n == 6:  # the role chunk and 5 words
                await asyncio.sleep(60)
            yield chunk
            n += 1

    a._stream = stalls  # type: ignore[method-assign]
    mesh = mesh_of(a, b)
    forwarder = mesh.gateway.forwarder
    assert isinstance(forwarder, ASGIForwarder)
    forwarder.idle_s = 1.0  # the longest silence between two chunks
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(stream=True))
        assert "".join(c["choices"][0]["delta"].get("content") or ""
                       for c in events(resp.text)) == TEXT
        assert "failed mid-stream (stream)" in resp.text
    assert b.seen[0]["messages"][-1]["content"] == "".join(WORDS[:5])


def test_the_transcript_sends_whole_events_only_whatever_their_line_ends() -> None:
    kept = Transcript("chat")
    assert kept(b'data: {"a": 1}\r\n\r\ndata: {"b"') == b'data: {"a": 1}\r\n\r\n'
    assert kept(b': 2}\r\n\r\n') == b'data: {"b": 2}\r\n\r\n'
    assert kept(b'data: {"c": 3}\n\ndata: [DO') == b'data: {"c": 3}\n\n'
    assert kept.flush() == b"data: [DO"
    assert bytes(kept.sent) == b'data: {"a": 1}\r\n\r\ndata: {"b": 2}\r\n\r\ndata: {"c": 3}\n\n'


@pytest.mark.parametrize(("deltas", "refusal"), [
    ([{"content": "a"}, {"content": "b"}], ""),
    ([{"content": "a"}, {"tool_calls": [{"index": 0}]}], "it relayed a tool call"),
    ([{"reasoning_content": "hmm"}], "it relayed reasoning"),
])
def test_what_a_stream_told_its_client(deltas: list[dict[str, Any]], refusal: str) -> None:
    sent = b"".join(b"data: " + json.dumps({"id": "x", "choices": [
        {"index": 0, "delta": d}]}).encode() + b"\n\n" for d in deltas)
    told = partial_of(sent, "chat")
    assert told.refusal == refusal and told.id == "x"
    assert told.text == "".join(d.get("content", "") for d in deltas)


async def test_a_continuation_route_that_fails_at_once_is_passed_for_the_next() -> None:
    a, b, c = Continuer("a", die_after=5), Continuer("b"), Continuer("c")
    mesh = Mesh({1: a, 3: c})  # type: ignore[dict-item]  # b's head: nobody listens
    mesh.add(node("a", 0, 39, 1, tps=30), node("b", 0, 39, 2, tps=20),
             node("c", 0, 39, 3, tps=10))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(stream=True))
        chunks = events(resp.text)
        assert "".join(ch["choices"][0]["delta"].get("content") or ""
                       for ch in chunks) == TEXT
        assert chunks[-1]["meshroute"]["routes"] == ["m|a[0-39]", "m|c[0-39]"]
        assert "continues on m|c[0-39]" in resp.text and "on m|b" not in resp.text
    assert b.seen == []


@pytest.mark.parametrize("shape", [
    {"response_format": {"type": "json_object"}},
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}},
    {"grammar": "root ::= \"a\""},
])
async def test_a_constrained_format_is_not_continued(shape: dict[str, Any]) -> None:
    """A grammar or schema would start over at the continuation's first token."""
    a, b = Continuer("a", die_after=5), Continuer("b")
    mesh = mesh_of(a, b)
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(stream=True, **shape))
        assert events(resp.text)[-1]["error"]["code"] == "upstream_failed"
        whole = await client.post("/v1/chat/completions", json=chat(**shape))
        assert whole.status_code == 200  # forwarded as sent: not gathered from a stream
    seen = a.seen + b.seen
    assert not any(m["role"] == "assistant" for body in seen for m in body["messages"])
    assert sum(1 for body in seen if "stream" not in body) == 1  # the whole one, as sent


async def test_a_hedge_that_won_and_then_died_is_continued() -> None:
    """The hedge's race is won by the hedge, whose stream then dies: the continuation runs
    without a race of its own (a second race inside the first once cut every such
    continuation with CancelledError) and the client reads the whole answer."""
    slow, hedge, third = (Continuer("a", delay_s=5.0), Continuer("b", die_after=5),
                          Continuer("c"))
    mesh = Mesh({1: slow, 2: hedge, 3: third},  # type: ignore[dict-item]
                hedge_after="20ms", hedge_max_share=1.0)
    mesh.add(node("a", 0, 39, 1, tps=30), node("b", 0, 39, 2, tps=20),
             node("c", 0, 39, 3, tps=10))
    mesh.gateway.hedging.cap.credit = 1.0  # type: ignore[union-attr]
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(stream=True))
    chunks = events(resp.text)
    assert not any("error" in c for c in chunks), chunks[-1]
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks
                   if c["choices"]) == TEXT
    assert chunks[-1]["meshroute"]["routes"] == ["m|b[0-39]", "m|c[0-39]"]
    assert mesh.gateway.hedging.counts["won"] == 1  # type: ignore[union-attr]
