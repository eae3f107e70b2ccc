"""A chat-completions SSE stream as Messages events, chunk by chunk (pure)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from meshroute_middleware.chat.dialects.wire.anthropic import Asked
from meshroute_middleware.chat.dialects.wire.anthropic_stream import MessageStream, SseLines
from meshroute_middleware.core.contracts.error_body import sse_error_event

ASKED = Asked("claude-x", ("END",), True)


def data(delta: dict[str, Any] | None = None, finish: str | None = None,
         **extra: Any) -> bytes:
    chunk: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk", **extra,
                             "choices": [] if delta is None else [
                                 {"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


TEXT_STREAM = (data({"role": "assistant", "content": ""}) + data({"content": "Hel"})
               + data({"content": "lo"}) + data({}, "stop")
               + data(None, usage={"prompt_tokens": 9, "completion_tokens": 2})
               + b"data: [DONE]\n\n")


def events(raw: bytes) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if block.strip():
            name, body = block.split("\n", 1)
            assert name.startswith("event: ") and body.startswith("data: ")
            payload = json.loads(body[6:])
            assert payload["type"] == name[7:]
            out.append((name[7:], payload))
    return out


def translate(raw: bytes, cuts: list[int] | None = None) -> bytes:
    stream = MessageStream(ASKED, "msg_1", input_tokens=3)
    out, at = [], 0
    for cut in [*sorted(cuts or []), len(raw)]:
        out.append(stream.feed(raw[at:cut]))
        at = max(at, cut)
    out.append(stream.close())
    return b"".join(out)


def test_a_text_stream_in_anthropic_order() -> None:
    got = events(translate(TEXT_STREAM))
    assert [name for name, _ in got] == [
        "message_start", "ping", "content_block_start", "content_block_delta",
        "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    start = got[0][1]["message"]
    assert start["id"] == "msg_1" and start["model"] == "claude-x"
    assert start["usage"] == {"input_tokens": 3, "output_tokens": 0}
    assert [e["delta"]["text"] for n, e in got if n == "content_block_delta"] == ["Hel", "lo"]
    assert got[6][1]["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}
    assert got[6][1]["usage"] == {"input_tokens": 9, "output_tokens": 2}


@given(st.lists(st.integers(0, len(TEXT_STREAM)), max_size=12))
def test_however_the_stream_is_split_the_events_are_the_same(cuts: list[int]) -> None:
    assert translate(TEXT_STREAM, cuts) == translate(TEXT_STREAM)


def test_tool_calls_stream_as_input_json_deltas() -> None:
    raw = (data({"content": "Looking."})
           + data({"tool_calls": [{"index": 0, "id": "call_9", "type": "function",
                                   "function": {"name": "weather", "arguments": ""}}]})
           + data({"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]})
           + data({"tool_calls": [{"index": 0, "function": {"arguments": ' "Paris"}'}}]})
           + data({}, "tool_calls") + b"data: [DONE]\n\n")
    got = events(translate(raw))
    assert [name for name, _ in got] == [
        "message_start", "ping", "content_block_start", "content_block_delta",
        "content_block_stop", "content_block_start", "content_block_delta",
        "content_block_delta", "content_block_stop", "message_delta", "message_stop"]
    assert got[5][1] == {"type": "content_block_start", "index": 1, "content_block": {
        "type": "tool_use", "id": "call_9", "name": "weather", "input": {}}}
    parts = [e["delta"]["partial_json"] for n, e in got
             if n == "content_block_delta" and e["index"] == 1]
    assert json.loads("".join(parts)) == {"city": "Paris"}
    assert got[9][1]["delta"]["stop_reason"] == "tool_use"
    assert got[9][1]["usage"]["output_tokens"] == 3  # no usage: the deltas counted


def test_a_stream_that_breaks_ends_with_an_error_event() -> None:
    raw = data({"content": "par"}) + sse_error_event("the provider failed mid-stream")
    got = events(translate(raw + data({"content": "ignored"})))
    assert [name for name, _ in got][-1] == "error"
    assert got[-1][1]["error"] == {"type": "api_error",
                                   "message": "the provider failed mid-stream"}
    assert all(e.get("delta", {}).get("text") != "ignored" for _, e in got)


def test_a_stream_cut_without_its_end_is_an_error_not_a_finished_message() -> None:
    got = events(translate(data({"content": "par"})))
    assert got[-1][0] == "error"
    assert "message_stop" not in [name for name, _ in got]


def test_a_stream_without_done_but_finished_still_closes() -> None:
    got = events(translate(data({"content": "x"}) + data({}, "length")))
    assert got[-2][1]["delta"]["stop_reason"] == "max_tokens"
    assert got[-1][0] == "message_stop"


def test_a_matched_stop_sequence_is_named() -> None:
    raw = data({"content": "x"}) + data({}, "stop").replace(
        b'"finish_reason": "stop"', b'"finish_reason": "stop", "stop_reason": "END"')
    got = events(translate(raw + b"data: [DONE]\n\n"))
    assert got[-2][1]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}


def test_lines_hold_only_the_unfinished_line() -> None:
    lines = SseLines()
    assert list(lines.feed(b"data: a")) == []
    assert list(lines.feed(b"b\ndata: c\n\nda")) == [b"data: ab", b"data: c", b""]
    assert lines.rest() == b"da"


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["choices", "delta", "content", "tool_calls", "index", "id", "function", "name",
         "arguments", "finish_reason", "usage", "error", "message", "prompt_tokens",
         "completion_tokens", "stop_reason"]), inner, max_size=4), max_leaves=16)


@given(st.lists(JSONISH, max_size=6))
def test_whatever_a_route_streams_the_translation_never_raises(chunks: list[object]) -> None:
    stream = MessageStream(ASKED, "msg_1")
    raw = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    events(stream.feed(raw) + stream.close())  # well-formed events, whatever came


@given(JSONISH)
def test_whatever_a_route_answers_the_message_is_well_formed(answer: object) -> None:
    from meshroute_middleware.chat.dialects.wire.anthropic import message
    if isinstance(answer, dict):
        out = message(answer, ASKED, "msg_1")
        assert out["type"] == "message" and isinstance(out["content"], list)
        assert isinstance(out["usage"]["input_tokens"], int)
