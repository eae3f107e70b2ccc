"""Asking every upstream for streamed usage, and keeping the client's stream as it asked
(issue 32): the body rewrite and the stream filter, chunk by chunk."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.types import Message

from meshroute_middleware.chat.stream_usage import UsageStrip, with_usage

pytestmark = pytest.mark.anyio
SSE = [(b"content-type", b"text/event-stream")]


def event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


TOKEN = {"id": "c", "choices": [{"index": 0, "delta": {"content": "hi"}}]}
STOP = {"id": "c", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
USAGE = {"id": "c", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 2}}
DONE = b"data: [DONE]\n\n"
# what the client would get without the gateway's ask, and what the upstream sent with it
PLAIN = event(TOKEN) + event(STOP) + DONE
ASKED = (event({**TOKEN, "usage": None}) + event({**STOP, "usage": None}) + event(USAGE)
         + DONE)


@pytest.mark.parametrize("body", [
    b'{"model":"m","stream":true,"messages":[]}',
    b'  {"model": "m", "stream": true}',
    b'{"model":"m","stream":true,"stream_options":{"include_usage":false}}',
    b'{"model":"m","stream":true,"stream_options":{"continuous_usage_stats":true}}',
])
def test_with_usage_asks_for_it_and_keeps_everything_else(body: bytes) -> None:
    asked = json.loads(with_usage(body))
    sent = json.loads(body)
    assert asked["stream_options"]["include_usage"] is True
    assert {k: v for k, v in asked.items() if k != "stream_options"} == \
        {k: v for k, v in sent.items() if k != "stream_options"}
    assert {k: v for k, v in asked["stream_options"].items() if k != "include_usage"} == \
        {k: v for k, v in sent.get("stream_options", {}).items() if k != "include_usage"}


async def strip(chunks: list[bytes], headers: list[tuple[bytes, bytes]] = SSE
                ) -> tuple[bytes, UsageStrip, list[Message]]:
    got: list[Message] = []

    async def send(message: Message) -> None:
        got.append(message)
    filtered = UsageStrip(send)
    await filtered({"type": "http.response.start", "status": 200, "headers": headers})
    for i, chunk in enumerate(chunks):
        await filtered({"type": "http.response.body", "body": chunk,
                        "more_body": i < len(chunks) - 1})
    return b"".join(m.get("body", b"") for m in got[1:]), filtered, got


@pytest.mark.parametrize("cut", [1, 7, 13, 64, 10_000])
async def test_the_stream_the_client_gets_is_the_one_it_asked_for(cut: int) -> None:
    """However the upstream's bytes are split, the client gets the stream without usage."""
    chunks = [ASKED[i:i + cut] for i in range(0, len(ASKED), cut)]
    out, filtered, _ = await strip(chunks)
    assert out == PLAIN
    assert filtered.dropped == 1


async def test_crlf_lines_and_spaced_json_are_stripped_too() -> None:
    asked = ASKED.replace(b"\n", b"\r\n").replace(b'"usage": null', b'"usage" :  null')
    out, _, _ = await strip([asked])
    assert out == PLAIN.replace(b"\n", b"\r\n")


async def test_usage_the_upstream_sends_inside_a_content_chunk_is_left_alone() -> None:
    """Only what the ask added is taken out (llama.cpp sends usage in its last chunk)."""
    stream = event(TOKEN) + event({**STOP, "usage": {"prompt_tokens": 3}}) + DONE
    out, filtered, _ = await strip([stream])
    assert out == stream and filtered.dropped == 0


async def test_an_answer_that_is_not_a_stream_passes_untouched() -> None:
    body = json.dumps({"choices": [], "usage": {"prompt_tokens": 1}}).encode()
    out, _, got = await strip([body[:5], body[5:]], [(b"content-type", b"application/json")])
    assert out == body and [m.get("body") for m in got[1:]] == [body[:5], body[5:]]


async def test_whole_lines_pass_at_once_and_only_a_cut_line_waits_for_its_end() -> None:
    first = event(TOKEN)
    _, _, got = await strip([first + b"data: {\"id\"", b': "c"}\n\n' + DONE])
    assert [m["body"] for m in got[1:]] == [first, b'data: {"id": "c"}\n\n' + DONE]


async def test_a_stream_sent_with_a_content_length_loses_it() -> None:
    """What is taken out shortens the stream: a length the upstream sent would be a lie."""
    out, _, got = await strip([ASKED], [*SSE, (b"content-length", str(len(ASKED)).encode())])
    assert out == PLAIN and got[0]["headers"] == SSE


@pytest.mark.parametrize("cut", [1, 9, 10_000])
async def test_openais_compact_spelling_is_stripped_however_it_is_cut(cut: int) -> None:
    def compact(data: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
    plain = compact(TOKEN) + compact(STOP) + DONE
    asked = (compact({**TOKEN, "usage": None}) + compact({**STOP, "usage": None})
             + compact(USAGE) + DONE)
    out, filtered, _ = await strip([asked[i:i + cut] for i in range(0, len(asked), cut)])
    assert out == plain and filtered.dropped == 1
