"""MessagesTranslation.send at the ASGI level: what the client gets for each OpenAI answer."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from starlette.types import Message

from meshroute_middleware.chat.dialects import anthropic as dialect
from meshroute_middleware.chat.dialects.anthropic import MESSAGES

REQUEST = json.dumps({"model": "claude-x", "max_tokens": 8, "stream": True,
                      "messages": [{"role": "user", "content": "hi"}]}).encode()


def relay(start: Message, *bodies: bytes, request: bytes | None = REQUEST) -> list[Message]:
    """The messages the client gets when the chat path sends `start` and `bodies`."""
    sent: list[Message] = []

    async def client(message: Message) -> None:
        sent.append(message)

    async def run() -> None:
        translation = MESSAGES.open(client)
        if request is not None:
            translation.request(request)
        await translation.send(start)
        for i, body in enumerate(bodies):
            await translation.send({"type": "http.response.body", "body": body,
                                    "more_body": i < len(bodies) - 1})
    asyncio.run(run())
    return sent


def start(status: int, content_type: bytes, *extra: tuple[bytes, bytes]) -> Message:
    return {"type": "http.response.start", "status": status,
            "headers": [(b"content-type", content_type), (b"content-length", b"999"), *extra]}


def body(sent: list[Message]) -> bytes:
    return b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_a_stream_is_sent_as_it_comes_with_our_headers_kept() -> None:
    chunk = b'data: {"choices": [{"index": 0, "delta": {"content": "hey"}}]}\n\n'
    sent = relay(start(200, b"text/event-stream", (b"x-meshroute-route", b"r1")),
                 chunk[:10], chunk[10:], b'data: {"choices": [{"index": 0, "delta": {}, '
                 b'"finish_reason": "stop"}]}\n\ndata: [DONE]\n\n')
    headers = dict(sent[0]["headers"])
    assert b"content-length" not in headers and headers[b"x-meshroute-route"] == b"r1"
    assert headers[b"content-type"].startswith(b"text/event-stream")
    assert [m["type"] for m in sent][:2] == ["http.response.start", "http.response.body"]
    assert b"event: message_start" in sent[1]["body"]  # sent before the stream ended
    assert b'"text": "hey"' in sent[1]["body"]
    assert body(sent).endswith(b'event: message_stop\ndata: {"type": "message_stop"}\n\n')


def test_an_error_before_the_request_is_read_keeps_its_status_and_retry_after() -> None:
    error = json.dumps({"error": {"message": "slow down", "type": "rate_limit_error",
                                  "code": "rate_limited"}}).encode()
    sent = relay(start(429, b"application/json", (b"retry-after", b"3")), error, request=None)
    assert sent[0]["status"] == 429
    headers = dict(sent[0]["headers"])
    assert headers[b"retry-after"] == b"3"
    assert headers[b"content-length"] == str(len(body(sent))).encode()
    assert json.loads(body(sent)) == {"type": "error", "error": {
        "type": "rate_limit_error", "message": "slow down"}}


def test_an_error_that_is_not_json_keeps_its_text() -> None:
    sent = relay(start(502, b"text/html"), b"<h1>bad gateway</h1>", request=None)
    assert json.loads(body(sent))["error"] == {"type": "api_error",
                                               "message": "<h1>bad gateway</h1>"}


@pytest.mark.parametrize("answer", [b"not json", b"[1, 2]", b'{"object": "list"}'])
def test_a_success_that_is_no_completion_is_a_502(answer: bytes) -> None:
    sent = relay(start(200, b"application/json"), answer)
    assert sent[0]["status"] == 502
    assert json.loads(body(sent))["error"]["type"] == "api_error"


def test_an_answer_past_the_limit_is_dropped_for_a_502(monkeypatch: Any) -> None:
    monkeypatch.setattr(dialect, "MAX_ANSWER_BYTES", 64)
    sent = relay(start(200, b"application/json"), b"{" + b" " * 50, b" " * 50 + b"}")
    assert sent[0]["status"] == 502
    assert "larger than meshroute holds" in json.loads(body(sent))["error"]["message"]
