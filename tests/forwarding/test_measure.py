"""TokenMeter: completion tokens from a JSON body's usage or from SSE chunks, fed in pieces."""

from __future__ import annotations

import json

import pytest

from meshroute_middleware.forwarding.measure import TokenMeter


def feed(meter: TokenMeter, body: bytes, size: int) -> int:
    for i in range(0, len(body), size):
        meter.feed(body[i:i + size])
    return meter.completion_tokens


@pytest.mark.parametrize("size", [1, 7, 4096])
def test_json_usage_is_read_whatever_the_chunking(size: int) -> None:
    body = json.dumps({"choices": [{"message": {"content": "hi"}}],
                       "usage": {"prompt_tokens": 5, "completion_tokens": 42}}).encode()
    assert feed(TokenMeter(streaming=False), body, size) == 42


def test_json_usage_wins_over_the_words_in_the_content() -> None:
    # The answer itself talks about "completion_tokens": the last key, usage's, counts.
    body = json.dumps({"choices": [{"message": {"content": '"completion_tokens": 999'}}],
                       "usage": {"completion_tokens": 7}}).encode()
    assert feed(TokenMeter(streaming=False), body, 4096) == 7


def test_a_key_without_a_number_after_the_real_one_is_skipped() -> None:
    body = b'{"usage": {"completion_tokens": 12}, "x": "\\"completion_tokens\\": none"}'
    assert feed(TokenMeter(streaming=False), body, 4096) == 12


def test_json_without_usage_counts_zero() -> None:
    assert feed(TokenMeter(streaming=False), b'{"choices": []}', 4096) == 0


@pytest.mark.parametrize("size", [1, 5, 4096])
def test_sse_counts_content_chunks_or_takes_usage(size: int) -> None:
    chunks = [{"choices": [{"delta": {"content": f"t{i}"}}]} for i in range(9)]
    chunks.append({"choices": [{"delta": {"content": ""}}]})  # empty: not a token
    stream = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    assert feed(TokenMeter(streaming=True), stream + b"data: [DONE]\n\n", size) == 9
    usage = b'data: {"choices": [], "usage": {"completion_tokens": 30}}\n\n'
    assert feed(TokenMeter(streaming=True), stream + usage, size) == 30
