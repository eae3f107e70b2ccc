"""Chat completions -> Messages and back, for routes that speak only Messages (pure)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import example, given
from hypothesis import strategies as st

from meshroute_middleware.chat.dialects.wire.anthropic import chat_request
from meshroute_middleware.chat.dialects.wire.anthropic_chat import (
    ChatStream,
    chat_completion,
    chat_error,
    messages_request,
)


def test_a_chat_request_as_messages() -> None:
    chat = {"model": "auto", "max_completion_tokens": 30, "temperature": 0.5, "stop": "END",
            "user": "u1", "stream": True, "tools": [{"type": "function", "function": {
                "name": "w", "description": "weather", "parameters": {"type": "object"}}}],
            "tool_choice": "required", "parallel_tool_calls": False,
            "messages": [
                {"role": "system", "content": "brief"},
                {"role": "user", "content": [
                    {"type": "text", "text": "see"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}},
                    {"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function",
                     "function": {"name": "w", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "18C"},
                {"role": "user", "content": "thanks"}]}
    out = messages_request(chat, "claude-real")
    assert out["model"] == "claude-real" and out["max_tokens"] == 30
    assert out["system"] == "brief" and out["stop_sequences"] == ["END"]
    assert out["temperature"] == 0.5 and out["stream"] is True
    assert out["metadata"] == {"user_id": "u1"}
    assert out["tools"] == [{"name": "w", "description": "weather",
                             "input_schema": {"type": "object"}}]
    assert out["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert out["messages"] == [
        {"role": "user", "content": [
            {"type": "text", "text": "see"},
            {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                         "data": "AAA"}},
            {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "c1", "name": "w", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [  # the tool's result and the next words: one turn
            {"type": "tool_result", "tool_use_id": "c1", "content": "18C"},
            {"type": "text", "text": "thanks"}]}]


WORDS = st.text(st.characters(codec="utf-8"), min_size=1, max_size=8)


@given(st.lists(st.tuples(st.sampled_from(["user", "assistant"]), WORDS), min_size=1,
                max_size=6), WORDS)
def test_messages_to_chat_and_back_keeps_the_conversation(turns: list[tuple[str, str]],
                                                          system: str) -> None:
    body = {"model": "m", "max_tokens": 9, "system": system,
            "messages": [{"role": r, "content": t} for r, t in turns]}
    back = messages_request(chat_request(body)[0], "m")
    assert back["system"] == system and back["max_tokens"] == 9
    merged: list[dict[str, Any]] = []
    for role, text in turns:  # consecutive turns of one role become one
        block = {"type": "text", "text": text}
        if merged and merged[-1]["role"] == role:
            merged[-1]["content"].append(block)
        else:
            merged.append({"role": role, "content": [block]})
    assert back["messages"] == merged


def test_a_message_as_a_chat_completion() -> None:
    out = chat_completion({"id": "msg_1", "content": [
        {"type": "text", "text": "Looking."},
        {"type": "tool_use", "id": "t1", "name": "w", "input": {"city": "Paris"}}],
        "stop_reason": "tool_use", "usage": {"input_tokens": 5, "output_tokens": 7}}, "claude")
    assert out["model"] == "claude"
    assert out["choices"] == [{"index": 0, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Looking.", "tool_calls": [
            {"id": "t1", "type": "function",
             "function": {"name": "w", "arguments": json.dumps({"city": "Paris"})}}]}}]
    assert out["usage"] == {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}


def test_an_anthropic_error_as_an_openai_one() -> None:
    body = json.dumps({"type": "error", "error": {"type": "invalid_request_error",
                                                  "message": "prompt is bad"}}).encode()
    assert json.loads(chat_error(400, body)) == {"error": {
        "message": "prompt is bad", "type": "invalid_request_error", "code": "upstream_error"}}
    assert json.loads(chat_error(400, b"<html>"))["error"]["message"] == \
        "the route answered HTTP 400"


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()


STREAM = b"".join([
    _event("message_start", {"type": "message_start", "message": {
        "id": "msg_1", "usage": {"input_tokens": 5, "output_tokens": 1}}}),
    _event("ping", {"type": "ping"}),
    _event("content_block_start", {"type": "content_block_start", "index": 0,
                                   "content_block": {"type": "text", "text": ""}}),
    _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                   "delta": {"type": "text_delta", "text": "Hi"}}),
    _event("content_block_start", {"type": "content_block_start", "index": 1,
                                   "content_block": {"type": "tool_use", "id": "t1",
                                                     "name": "w", "input": {}}}),
    _event("content_block_delta", {"type": "content_block_delta", "index": 1,
                                   "delta": {"type": "input_json_delta",
                                             "partial_json": '{"a": 1}'}}),
    _event("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use"},
                             "usage": {"output_tokens": 6}}),
    _event("message_stop", {"type": "message_stop"})])


def chunks(raw: bytes) -> list[Any]:
    out = []
    for event in raw.decode().split("\n\n"):
        if event.startswith("data: "):
            out.append(event[6:] if event[6:] == "[DONE]" else json.loads(event[6:]))
    return out


@given(st.lists(st.integers(0, len(STREAM)), max_size=8))
def test_a_messages_stream_as_chat_chunks_however_split(cuts: list[int]) -> None:
    stream = ChatStream("claude", include_usage=True)
    out, at = [], 0
    for cut in [*sorted(cuts), len(STREAM)]:
        out.append(stream.feed(STREAM[at:cut]))
        at = cut
    got = chunks(b"".join(out) + stream.close())
    deltas = [c["choices"][0]["delta"] for c in got[:-2]]
    assert deltas == [
        {"role": "assistant", "content": ""}, {"content": "Hi"},
        {"tool_calls": [{"index": 0, "id": "t1", "type": "function",
                         "function": {"name": "w", "arguments": ""}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]}, {}]
    assert got[-3]["choices"][0]["finish_reason"] == "tool_calls"
    assert got[-2]["usage"] == {"prompt_tokens": 5, "completion_tokens": 6, "total_tokens": 11}
    assert got[-1] == "[DONE]"


def test_a_messages_stream_that_errs_or_stops_short_ends_with_an_openai_error() -> None:
    stream = ChatStream("claude", include_usage=False)
    err = _event("error", {"type": "error", "error": {"type": "overloaded_error",
                                                      "message": "busy"}})
    assert chunks(stream.feed(STREAM[:200] + err) + stream.close())[-1]["error"]["message"] \
        == "busy"
    short = ChatStream("claude", include_usage=False)
    assert "error" in chunks(short.feed(STREAM[:300]) + short.close())[-1]


JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=4),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["type", "message", "usage", "index", "content_block", "delta", "text", "id", "name",
         "partial_json", "stop_reason", "error", "input_tokens", "output_tokens", "role",
         "content", "tool_calls", "function", "arguments", "tools", "tool_choice", "messages",
         "stop", "image_url", "url", "parameters", "tool_call_id"]), inner, max_size=5),
    max_leaves=16)
KINDS = st.sampled_from(["message_start", "content_block_start", "content_block_delta",
                         "message_delta", "message_stop", "error", "ping"])


@given(st.lists(st.tuples(KINDS, st.dictionaries(st.sampled_from(
    ["message", "usage", "index", "content_block", "delta", "error"]), JSONISH, max_size=3)),
    max_size=6))
@example([("message_start", {"message": {"usage": [1, 2]}}),
          ("message_delta", {"usage": "many"})])
def test_whatever_a_messages_route_streams_the_translation_never_raises(
        events: list[tuple[str, dict[str, Any]]]) -> None:
    stream = ChatStream("claude", include_usage=True)
    raw = b"".join(_event(kind, {**data, "type": kind}) for kind, data in events)
    for chunk in chunks(stream.feed(raw) + stream.close()):
        assert chunk == "[DONE]" or isinstance(chunk, dict)


@given(JSONISH)
def test_whatever_a_chat_client_or_a_route_sends_the_translations_never_raise(
        value: object) -> None:
    if isinstance(value, dict):
        json.dumps(messages_request(value, "claude"))
        assert chat_completion(value, "claude")["object"] == "chat.completion"
