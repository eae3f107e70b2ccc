"""The answer rewrite of an aliased request: every `model` member, however the bytes are cut,
and nothing held but an incomplete member's tail."""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshroute_middleware.chat.aliasing import MAX_HELD_BYTES, answer_model, split_open

pytestmark = pytest.mark.anyio
ASKED = "claude-sonnet-4-5"


async def run(kind: bytes, parts: list[bytes]) -> tuple[list[dict[str, Any]], bytes]:
    sent: list[dict[str, Any]] = []

    async def sink(message: Any) -> None:
        sent.append(message)

    send = answer_model(sink, ASKED)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", kind), (b"content-length", b"99")]})
    for i, part in enumerate(parts):
        await send({"type": "http.response.body", "body": part,
                    "more_body": i < len(parts) - 1})
    return sent, b"".join(m.get("body", b"") for m in sent[1:])


def sse(n: int) -> bytes:
    return b"".join(b"data: " + json.dumps({"id": i, "model": "qwen-2.5-72b",
                                            "choices": [{"delta": {"content": f"t{i}"}}]},
                                           separators=(",", ":") if i % 2 else (", ", ": "),
                                           ).encode() + b"\n\n" for i in range(n))


@pytest.mark.parametrize("size", [1, 3, 7, 64, 10_000])
async def test_every_cut_of_a_stream_is_rewritten(size: int) -> None:
    data = sse(6) + b"data: [DONE]\n\n"
    sent, out = await run(b"text/event-stream", [data[i:i + size]
                                                 for i in range(0, len(data), size)])
    assert b"content-length" not in dict(sent[0]["headers"])
    assert out == data.replace(b'"model": "qwen-2.5-72b"', b'"model":"claude-sonnet-4-5"'
                               ).replace(b'"model":"qwen-2.5-72b"',
                                         b'"model":"claude-sonnet-4-5"')


async def test_a_chunk_without_a_model_prefix_is_not_held() -> None:
    sent, _ = await run(b"text/event-stream", [b"data: {\"a\": 1}\n\n", b""])
    assert sent[1]["body"] == b"data: {\"a\": 1}\n\n"
    assert split_open(b'x "mo') == 2 and split_open(b'"model": "qw') == 0
    assert split_open(b'"model": "qwen", 1') == len(b'"model": "qwen", 1')
    assert split_open(b'{"role": "model"}') == len(b'{"role": "model"}')  # a value, not a key


async def test_json_and_text_in_content_are_left_alone() -> None:
    body = json.dumps({"model": "qwen", "choices": [{"message": {
        "content": 'say "model": "x"', "tool_calls": [{"function": {
            "arguments": json.dumps({"model": "keep"})}}]}}]}).encode()
    _, out = await run(b"application/json", [body[:10], body[10:]])
    answer = json.loads(out)
    assert answer["model"] == ASKED
    message = answer["choices"][0]["message"]
    assert message["content"] == 'say "model": "x"'
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"model": "keep"}


async def test_other_answers_pass_untouched_and_a_huge_name_is_not_held_forever() -> None:
    _, out = await run(b"text/plain", [b'"model": "qwen"'])
    assert out == b'"model": "qwen"'
    huge = b'data: {"model": "' + b"x" * (MAX_HELD_BYTES + 10)
    sent, _ = await run(b"text/event-stream", [huge, b'"}\n\n'])
    assert len(sent[1]["body"]) == len(huge)  # passed on, not held
