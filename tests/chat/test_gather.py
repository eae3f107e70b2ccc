"""chat/gather.Gathering: a stream folded into one JSON answer as it comes, whatever the body
messages' boundaries, and a node's malformed chunk fields ignored, not raised."""

from __future__ import annotations

import json
from collections.abc import MutableMapping
from typing import Any

import pytest

from meshroute_middleware.chat.gather import Gathering

pytestmark = pytest.mark.anyio
SSE = [(b"content-type", b"text/event-stream")]


def event(delta: dict[str, Any], index: object = 0, finish: str | None = None) -> bytes:
    chunk = {"id": "c1", "model": "m", "choices": [{"index": index, "delta": delta,
                                                     "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


async def gathered(parts: list[bytes]
                   ) -> tuple[list[MutableMapping[str, Any]], dict[str, Any]]:
    sent: list[MutableMapping[str, Any]] = []

    async def client(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    send = Gathering(client, "chat")
    await send({"type": "http.response.start", "status": 200, "headers": SSE})
    for i, part in enumerate(parts):
        await send({"type": "http.response.body", "body": part,
                    "more_body": i < len(parts) - 1})
    return sent, json.loads(sent[-1]["body"])


async def test_events_split_anywhere_make_one_answer() -> None:
    raw = (event({"role": "assistant", "content": "Hello"}) + event({"content": ", wor"})
           + event({"content": "ld"}, finish="stop") + b"data: [DONE]\n\n")
    whole = (await gathered([raw]))[1]
    for cut in range(1, len(raw), 7):  # every boundary, mid-line included
        sent, answer = await gathered([raw[:cut], raw[cut:]])
        assert answer == whole
    assert whole["choices"][0]["message"]["content"] == "Hello, world"
    assert whole["choices"][0]["finish_reason"] == "stop"
    assert sent[0]["status"] == 200 and (b"content-type", b"application/json") in sent[0]["headers"]


async def test_a_malformed_index_or_function_is_ignored_not_raised() -> None:
    raw = (event({"content": "a"}, index="x")
           + event({"tool_calls": [{"index": "y", "function": "not an object"}]})
           + event({"content": "b"}, finish="stop"))
    answer = (await gathered([raw]))[1]
    assert answer["choices"][0]["message"]["content"] == "ab"


async def test_an_error_event_is_a_502() -> None:
    raw = event({"content": "a"}) + b'data: {"error": {"message": "boom"}}\n\n'
    sent, answer = await gathered([raw])
    assert sent[0]["status"] == 502 and answer["error"]["code"] == "upstream_failed"
