"""TokenMeter: completion tokens from a JSON body's usage or from SSE chunks, fed in pieces."""

from __future__ import annotations

import json
import time

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


@pytest.mark.parametrize("size", [1, 7, 4096])
def test_prompt_tokens_from_usage_json_or_stream(size: int) -> None:
    body = json.dumps({"choices": [{"message": {"content": '"prompt_tokens": 999'}}],
                       "usage": {"prompt_tokens": 15, "completion_tokens": 42}}).encode()
    meter = TokenMeter(streaming=False)
    feed(meter, body, size)
    assert meter.prompt_tokens == 15
    stream = (b'data: {"choices": [{"delta": {"content": "prompt_tokens: 3"}}]}\n\n'
              b'data: {"choices": [], "usage": {"prompt_tokens": 21, '
              b'"completion_tokens": 30}}\n\ndata: [DONE]\n\n')
    meter = TokenMeter(streaming=True)
    assert feed(meter, stream, size) == 30
    assert meter.prompt_tokens == 21


def test_no_usage_no_prompt_tokens() -> None:
    json_meter, sse_meter = TokenMeter(streaming=False), TokenMeter(streaming=True)
    json_meter.feed(b'{"choices": []}')
    sse_meter.feed(b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n')
    assert json_meter.prompt_tokens is None and sse_meter.prompt_tokens is None


def _cpu_s(meter: TokenMeter, data: bytes, size: int) -> float:
    """CPU seconds to feed `data` in `size`-byte writes (the best of three runs)."""
    best = float("inf")
    for _ in range(3):
        fresh = TokenMeter(streaming=meter.streaming)
        started = time.process_time()
        for i in range(0, len(data), size):
            fresh.feed(data[i:i + size])
        best = min(best, time.process_time() - started)
    return best


@pytest.mark.parametrize("streaming", [True, False])
def test_work_is_linear_in_the_bytes_however_one_long_line_is_split(streaming: bool) -> None:
    """Issue 22, item 9: a 1 MiB SSE line in 64-byte writes cost 3.7 CPU-s (the pending line
    re-joined on every chunk). The same bytes and the same number of writes as 1 KiB lines
    must cost about the same: a ratio, not a wall-clock bound."""
    one_line = b"data: " + b'{"content":"' + b"x" * (1024 * 1024 - 40) + b'"}\n'
    short = b"".join(b"data: " + b'{"content":"' + b"x" * 1000 + b'"}\n'
                     for _ in range(len(one_line) // 1020))
    long_s = _cpu_s(TokenMeter(streaming), one_line, 64)
    short_s = _cpu_s(TokenMeter(streaming), short, 64)
    assert long_s < 5 * short_s + 0.05, (long_s, short_s)


def test_a_long_line_fed_in_small_writes_still_counts() -> None:
    line = b'data: {"choices":[{"delta":{"content":"' + b"y" * 200_000 + b'"}}]}\n'
    assert feed(TokenMeter(streaming=True), line * 3, 64) == 3


def test_a_line_past_the_limit_is_skipped_to_its_end() -> None:
    huge = b'data: {"choices":[{"delta":{"content":"' + b"z" * (1024 * 1024 + 10) + b'"}}]}\n'
    ok = b'data: {"choices":[{"delta":{"content":"a"}}]}\n'
    assert feed(TokenMeter(streaming=True), ok + huge + ok, 4096) == 2


def test_a_messages_answer_counts_its_output_tokens() -> None:
    body = json.dumps({"type": "message", "content": [{"type": "text", "text": "hi"}],
                       "usage": {"input_tokens": 30, "output_tokens": 11}}).encode()
    assert feed(TokenMeter(streaming=False), body, 5) == 11


def _event(name: str, data: dict[str, object]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


@pytest.mark.parametrize("usage", [True, False])
def test_a_messages_stream_counts_its_last_usage_or_its_deltas(usage: bool) -> None:
    start = {"type": "message_start", "message": {"content": [], "usage": {
        "input_tokens": 30, "output_tokens": 1}}}
    deltas = [_event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                             "delta": {"type": "text_delta", "text": w}})
              for w in ("a", "b", "c")]
    deltas.append(_event("content_block_delta", {
        "type": "content_block_delta", "index": 1,
        "delta": {"type": "input_json_delta", "partial_json": "{}"}}))
    end = {"type": "message_delta", "delta": {"stop_reason": "end_turn"},
           **({"usage": {"output_tokens": 9}} if usage else {})}
    body = _event("message_start", start if usage else {"type": "message_start"}) + b"".join(
        deltas) + _event("message_delta", end)
    assert feed(TokenMeter(streaming=True), body, 3) == (9 if usage else 4)


def _text_event(text: str) -> bytes:
    event = {"object": "text_completion",
             "choices": [{"index": 0, "text": text, "finish_reason": None}]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


def test_a_completions_meter_counts_text_deltas_and_a_chat_meter_does_not() -> None:
    stream = b"".join(_text_event(t) for t in ("a", " b", "", " c")) + b"data: [DONE]\n\n"
    text, chat = TokenMeter(streaming=True, text=True), TokenMeter(streaming=True)
    for meter in (text, chat):
        meter.feed(stream)
    assert (text.completion_tokens, chat.completion_tokens) == (3, 0)
    content = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
    text.feed(content)  # a completions stream has no content deltas: not a token there
    assert text.completion_tokens == 3


@pytest.mark.parametrize("delta", [
    {"tool_calls": [{"index": 0, "function": {"arguments": "{\"q\":"}}]},
    {"reasoning_content": "let me think"},
    {"reasoning": "let me think"},
    {"content": None, "reasoning_content": "x"},
])
def test_tool_call_arguments_and_reasoning_count_as_tokens_without_usage(
        delta: dict[str, object]) -> None:
    """Issue 32: a stream of tool-call arguments or reasoning counted 0 when no usage came."""
    chunk = b"data: " + json.dumps({"choices": [{"index": 0, "delta": delta}]}).encode()
    empty = b"data: " + json.dumps({"choices": [{"index": 0, "delta": {
        "tool_calls": [{"index": 0, "function": {"arguments": ""}}]}}]}).encode()
    body = b"\n\n".join([chunk] * 5 + [empty]) + b"\n\n"
    assert feed(TokenMeter(streaming=True), body, 7) == 5


def test_a_messages_thinking_delta_counts() -> None:
    event = (b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
             b'"delta":{"type":"thinking_delta","thinking":"hm"}}\n\n')
    assert feed(TokenMeter(streaming=True), event * 3, 4096) == 3


@pytest.mark.parametrize("body", [
    b'{"usage": {"prompt_tokens": 12, "completion_tokens": 3}}',
    b'{"usage": {"prompt_tokens": 12, "completion_tokens": 3, '
    b'"prompt_tokens_details": {"cached_tokens": 8}}}',
    b'{"content": [], "usage": {"input_tokens": 5, "output_tokens": 2, '
    b'"cache_read_input_tokens": 40, "cache_creation_input_tokens": 9}}',
    b'{"content": [], "usage": {"input_tokens": 5, "output_tokens": 2}}',
    b'{"choices": [{"message": {"content": "cache cached_tokens"}}]}',
    b'{"usage": {"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": 1}}',
])
@pytest.mark.parametrize("streaming", [True, False])
def test_counts_at_once_are_the_counts_one_by_one(body: bytes, streaming: bool) -> None:
    meter = TokenMeter(streaming=streaming)
    meter.feed(b"data: " + body + b"\n\n" if streaming else body)
    assert meter.counts() == (meter.prompt_tokens, meter.completion_tokens,
                              meter.cached_tokens, meter.cache_write_tokens)
