"""The /v1/responses adapter on ASGI messages: what passes untouched, what is translated, and
a stream translated as it passes, however its bytes are split."""

from __future__ import annotations

import gzip
import json
from typing import Any

import httpx
import pytest
from starlette.types import Message

from meshroute_middleware.chat.dialects import DIALECTS
from meshroute_middleware.chat.dialects.responses import (
    MAX_EVENT_BYTES,
    RESPONSES_PATH,
    ResponsesDialect,
    ResponsesTranslation,
    SSELines,
)
from meshroute_middleware.core.contracts.error_body import sse_error_event
from meshroute_middleware.http.errors import RequestError

from ..test_annotate import make_app, wrap

pytestmark = pytest.mark.anyio
SSE = [(b"content-type", b"text/event-stream")]


class Client:
    """The client's send: every message it got."""

    def __init__(self) -> None:
        self.messages: list[Message] = []

    async def __call__(self, message: Message) -> None:
        self.messages.append(message)

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])

    def events(self) -> list[dict[str, Any]]:
        out = []
        for block in self.body.split(b"\n\n"):
            if block:
                kind, data = block.split(b"\n")
                event = json.loads(data.removeprefix(b"data: "))
                assert kind == b"event: " + event["type"].encode()
                out.append(event)
        return out


def opened(stream: bool = False) -> tuple[ResponsesTranslation, Client]:
    client = Client()
    translation = ResponsesDialect(clock=lambda: 1234.5).open(client)
    chat = json.loads(translation.request(json.dumps(
        {"model": "asked", "input": "hi", "stream": stream}).encode()))
    assert chat["messages"] == [{"role": "user", "content": "hi"}]
    return translation, client


def data(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


def delta(content: str, finish: str | None = None) -> bytes:
    return data({"choices": [{"index": 0, "delta": {"content": content},
                              "finish_reason": finish}]})


CHAT_STREAM = (delta("") + delta("hel") + delta("lo") + delta("", "stop")
               + data({"choices": [], "usage": {"prompt_tokens": 2, "completion_tokens": 2}})
               + b"data: [DONE]\n\n")


def test_the_dialect_is_registered_at_its_path() -> None:
    assert isinstance(DIALECTS[RESPONSES_PATH], ResponsesDialect)


def test_a_bad_body_is_a_400() -> None:
    translation = ResponsesDialect().open(Client())
    with pytest.raises(RequestError) as caught:
        translation.request(b'{"model": "m", "input": "hi", "previous_response_id": "r"}')
    assert (caught.value.status, caught.value.code, caught.value.param) == (
        400, "unsupported_parameter", "previous_response_id")
    with pytest.raises(RequestError) as not_json:
        translation.request(b"[1]")
    assert not_json.value.code == "invalid_request"


async def test_an_error_answer_passes_untouched() -> None:
    translation, client = opened()
    start = {"type": "http.response.start", "status": 503,
             "headers": [(b"content-type", b"application/json"), (b"content-length", b"9")]}
    body = {"type": "http.response.body", "body": b'{"error"}', "more_body": False}
    await translation.send(start)
    await translation.send(body)
    assert client.messages == [start, body]


async def test_an_answer_before_the_request_was_read_passes_untouched() -> None:
    client = Client()
    translation = ResponsesDialect().open(client)  # e.g. a 413 before the body was read
    start = {"type": "http.response.start", "status": 200, "headers": []}
    await translation.send(start)
    assert client.messages == [start]


async def test_a_json_answer_becomes_a_response_object() -> None:
    translation, client = opened()
    completion = json.dumps({"choices": [{"message": {"content": "hey"},
                                          "finish_reason": "stop"}]}).encode()
    await translation.send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", b"77"),
        (b"x-meshroute-route", b"m|a[0-9]")]})
    for i in range(len(completion)):  # split anywhere: held until whole
        await translation.send({"type": "http.response.body", "body": completion[i:i + 1],
                                "more_body": True})
    assert len(client.messages) == 1
    await translation.send({"type": "http.response.body", "body": b"", "more_body": False})
    start = client.messages[0]
    assert dict(start["headers"]) == {b"content-type": b"application/json",
                                      b"x-meshroute-route": b"m|a[0-9]"}  # no stale length
    answer = json.loads(client.body)
    assert answer["id"] == translation.response_id and answer["id"].startswith("resp_")
    assert answer["created_at"] == 1234 and answer["model"] == "asked"
    assert answer["output"][0]["content"][0]["text"] == "hey"
    assert client.messages[-1]["more_body"] is False


async def test_a_compressed_json_answer_is_read() -> None:
    translation, client = opened()
    body = gzip.compress(json.dumps({"choices": [{"message": {"content": "zipped"}}]}).encode())
    await translation.send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-encoding", b"gzip")]})
    await translation.send({"type": "http.response.body", "body": body[:10], "more_body": True})
    await translation.send({"type": "http.response.body", "body": body[10:],
                            "more_body": False})
    assert b"content-encoding" not in dict(client.messages[0]["headers"])
    assert json.loads(client.body)["output"][0]["content"][0]["text"] == "zipped"


async def test_an_unreadable_coding_is_a_502() -> None:
    translation, client = opened()
    await translation.send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-encoding", b"br")]})
    await translation.send({"type": "http.response.body", "body": b"\x00", "more_body": False})
    assert client.messages[0]["status"] == 502
    assert json.loads(client.body)["error"]["code"] == "upstream_failed"


async def test_an_unreadable_json_answer_is_never_ended_as_one() -> None:
    translation, client = opened()
    await translation.send({"type": "http.response.start", "status": 200, "headers": []})
    await translation.send({"type": "http.response.body", "body": b"{not json",
                            "more_body": False})
    # the start went out; no final body: the server aborts the connection
    assert [m["type"] for m in client.messages] == ["http.response.start"]


async def stream_through(pieces: list[bytes]) -> list[dict[str, Any]]:
    translation, client = opened(stream=True)
    await translation.send({"type": "http.response.start", "status": 200, "headers": SSE})
    for piece in pieces:
        await translation.send({"type": "http.response.body", "body": piece,
                                "more_body": True})
    await translation.send({"type": "http.response.body", "body": b"", "more_body": False})
    assert client.messages[-1]["more_body"] is False
    return client.events()


async def test_a_stream_is_translated_however_it_is_split() -> None:
    whole = await stream_through([CHAT_STREAM])
    assert [e["type"] for e in whole][-1] == "response.completed"
    assert whole[-1]["response"]["output"][0]["content"][0]["text"] == "hello"
    assert whole[-1]["response"]["usage"]["output_tokens"] == 2
    bytewise = await stream_through([CHAT_STREAM[i:i + 1] for i in range(len(CHAT_STREAM))])
    crlf = await stream_through([CHAT_STREAM.replace(b"\n", b"\r\n")])
    for other in (bytewise, crlf):
        assert [(e["type"], e.get("delta")) for e in other] == [
            (e["type"], e.get("delta")) for e in whole]


async def test_each_chunk_passes_on_as_it_comes() -> None:
    translation, client = opened(stream=True)
    await translation.send({"type": "http.response.start", "status": 200, "headers": SSE})
    assert [e["type"] for e in client.events()] == ["response.created",
                                                    "response.in_progress"]
    await translation.send({"type": "http.response.body", "body": delta("hel"),
                            "more_body": True})
    assert client.events()[-1]["delta"] == "hel"  # out before the next chunk came
    half = delta("lo")
    await translation.send({"type": "http.response.body", "body": half[:9], "more_body": True})
    assert client.events()[-1]["delta"] == "hel"
    await translation.send({"type": "http.response.body", "body": half[9:], "more_body": True})
    assert client.events()[-1]["delta"] == "lo"


async def test_the_chat_paths_error_event_ends_in_response_failed() -> None:
    events = await stream_through([delta("par"), sse_error_event("the head failed "
                                                                 "mid-stream")])
    assert [e["type"] for e in events][-2:] == ["error", "response.failed"]
    assert events[-2]["code"] == "upstream_failed"
    assert events[-1]["response"]["error"]["message"] == "the head failed mid-stream"


async def test_a_stream_without_done_still_completes() -> None:
    events = await stream_through([delta("a"), b"data: " + json.dumps(
        {"choices": [{"delta": {}, "finish_reason": "stop"}]}).encode()])  # no blank line
    assert events[-1]["type"] == "response.completed"


def test_sse_lines_join_data_and_skip_the_rest() -> None:
    lines = SSELines()
    assert lines.feed(b": ping\n\nevent: x\ndata: {\"a\":\ndata: 1}\n\nid: 3\n") == [
        b'{"a":\n1}']
    assert lines.feed(b"data:[DONE]\n\n") == [b"[DONE]"]
    assert lines.close() == []


def test_an_oversized_sse_line_is_dropped_not_grown() -> None:
    lines = SSELines()
    big = b"data: " + b"x" * (MAX_EVENT_BYTES + 10)
    out = [d for i in range(0, len(big), 1 << 20) for d in lines.feed(big[i:i + (1 << 20)])]
    assert out == [] and sum(len(p) for p in lines._parts) <= MAX_EVENT_BYTES + (1 << 20)
    assert lines.feed(b"\n\ndata: ok\n\n") == [b"ok"]


async def test_annotate_mode_serves_responses_through_the_apps_chat_route() -> None:
    """The app behind the middleware serves chat completions only: a /v1/responses request
    reaches it as the chat request it was translated to (routed, and for a model no route
    serves, which the app answers by itself)."""
    seen: list[dict[str, Any]] = []
    mw = wrap(make_app(seen, failing_head="nobody"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw),
                                 base_url="http://t") as client:
        for model in ("m", "the-apps-own"):
            answer = await client.post(RESPONSES_PATH, json={"model": model, "input": "hi"})
            assert answer.status_code == 200, answer.text
            assert answer.json()["object"] == "response"
            assert answer.json()["output"][0]["content"][0]["text"] == model
    assert seen[0]["route"] is not None and seen[-1]["route"] is None


async def test_a_streamed_requests_json_answer_is_sent_as_its_events() -> None:
    translation, client = opened(stream=True)
    await translation.send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json")]})  # a route that does not stream
    await translation.send({"type": "http.response.body", "more_body": False,
                            "body": json.dumps({"choices": [{"message": {
                                "content": "whole", "tool_calls": [{"id": "c", "function": {
                                    "name": "f", "arguments": "{}"}}]},
                                "finish_reason": "tool_calls"}]}).encode()})
    assert dict(client.messages[0]["headers"])[b"content-type"] == b"text/event-stream"
    events = client.events()
    assert [e["type"] for e in events][:3] == ["response.created", "response.in_progress",
                                               "response.output_item.added"]
    final = events[-1]
    assert final["type"] == "response.completed"
    assert [i["type"] for i in final["response"]["output"]] == ["message", "function_call"]
    assert final["response"]["output"][0]["content"][0]["text"] == "whole"
