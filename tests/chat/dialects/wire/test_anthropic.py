"""Messages <-> chat completions: the request, the message, the errors (pure)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshroute_middleware.chat.dialects.wire.anthropic import (
    Asked,
    MessagesError,
    chat_request,
    error_object,
    error_type,
    message,
)

USER = [{"role": "user", "content": "hi"}]


def req(**body: Any) -> dict[str, Any]:
    return chat_request({"model": "claude-x", "max_tokens": 64, "messages": USER, **body})[0]


def test_a_plain_request_keeps_model_and_max_tokens() -> None:
    chat, asked = chat_request({"model": "claude-x", "max_tokens": 64, "messages": USER})
    assert chat == {"model": "claude-x", "messages": USER, "max_tokens": 64}
    assert asked == Asked("claude-x", (), False)


def test_system_as_string_and_as_text_blocks() -> None:
    assert req(system="be brief")["messages"][0] == {"role": "system", "content": "be brief"}
    blocks = [{"type": "text", "text": "one", "cache_control": {"type": "ephemeral"}},
              {"type": "text", "text": "two"}]
    assert req(system=blocks)["messages"][0] == {"role": "system", "content": "one\n\ntwo"}


def test_sampling_stop_stream_and_metadata() -> None:
    chat = req(temperature=0.2, top_p=0.9, top_k=5, stop_sequences=["END", "###"], stream=True,
               metadata={"user_id": "u-1"})
    assert chat["temperature"] == 0.2 and chat["top_p"] == 0.9 and "top_k" not in chat
    assert chat["stop"] == ["END", "###"]
    assert chat["stream"] is True and chat["stream_options"] == {"include_usage": True}
    assert chat["user"] == "u-1"
    assert chat_request({"model": "m", "max_tokens": 1, "messages": USER,
                         "stop_sequences": ["END"]})[1].stop_sequences == ("END",)


def test_images_base64_and_url_become_image_url_parts() -> None:
    content = [{"type": "text", "text": "what is this?"},
               {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                            "data": "iVBORw0KGgo="}},
               {"type": "image", "source": {"type": "url", "url": "https://x.test/a.jpg"}}]
    chat = req(messages=[{"role": "user", "content": content}])
    assert chat["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
        {"type": "image_url", "image_url": {"url": "https://x.test/a.jpg"}}]}]


def test_a_tool_round_trip_becomes_tool_calls_and_tool_messages() -> None:
    messages = [
        {"role": "user", "content": "weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hm", "signature": "s"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "18C"}]},
            {"type": "text", "text": "and tomorrow?"}]}]
    tools = [{"name": "weather", "description": "the weather",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    chat = req(messages=messages, tools=tools, tool_choice={"type": "auto"})
    assert chat["messages"][1:] == [
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "toolu_1", "type": "function",
             "function": {"name": "weather", "arguments": json.dumps({"city": "Paris"})}}]},
        {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
        {"role": "user", "content": "and tomorrow?"}]
    assert chat["tools"] == [{"type": "function", "function": {
        "name": "weather", "description": "the weather",
        "parameters": tools[0]["input_schema"]}}]
    assert chat["tool_choice"] == "auto"


@pytest.mark.parametrize(("choice", "expected"), [
    ({"type": "auto"}, "auto"), ({"type": "any"}, "required"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "weather"}, {"type": "function", "function": {"name": "weather"}}),
])
def test_tool_choice(choice: dict[str, Any], expected: Any) -> None:
    tools = [{"name": "weather", "input_schema": {"type": "object"}}]
    assert req(tools=tools, tool_choice=choice)["tool_choice"] == expected


def test_disable_parallel_tool_use() -> None:
    tools = [{"name": "w", "input_schema": {"type": "object"}}]
    chat = req(tools=tools, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert chat["parallel_tool_calls"] is False


def test_an_image_in_a_tool_result_follows_in_a_user_message() -> None:
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/jpeg",
                                         "data": "AAAA"}}
    chat = req(messages=[{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [image]}]}])
    assert chat["messages"] == [
        {"role": "tool", "tool_call_id": "t", "content": ""},
        {"role": "user", "content": [{"type": "image_url", "image_url": {
            "url": "data:image/jpeg;base64,AAAA"}}]}]


@pytest.mark.parametrize(("body", "names"), [
    ({"messages": USER}, "max_tokens"),
    ({"max_tokens": 0, "messages": USER}, "max_tokens"),
    ({"max_tokens": True, "messages": USER}, "max_tokens"),
    ({"max_tokens": 8, "messages": []}, "messages"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "messages.0.role"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": 3}]}, "messages.0.content"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
     "messages.0.content.0"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "base64", "media_type": "image/tiff",
                                     "data": "x"}}]}]}, "media_type"),
    ({"max_tokens": 8, "messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "id": "t", "name": "w", "input": "no"}]}]}, "input"),
    ({"max_tokens": 8, "messages": USER, "temperature": "hot"}, "temperature"),
    ({"max_tokens": 8, "messages": USER, "stop_sequences": "END"}, "stop_sequences"),
    ({"max_tokens": 8, "messages": USER, "stream": "yes"}, "stream"),
    ({"max_tokens": 8, "messages": USER, "tools": [{"type": "web_search_20250305",
                                                    "name": "web_search"}]}, "server tool"),
    ({"max_tokens": 8, "messages": USER, "tool_choice": {"type": "tool"}}, "tool_choice.name"),
    ({"max_tokens": 8, "messages": USER, "metadata": {"user_id": 7}}, "metadata.user_id"),
    ({"max_tokens": 8, "messages": USER, "system": [{"type": "image"}]}, "system.0"),
])
def test_what_is_wrong_is_named(body: dict[str, Any], names: str) -> None:
    with pytest.raises(MessagesError, match=names.replace(".", r"\.")):
        chat_request({"model": "m", **body})


def test_count_tokens_needs_no_max_tokens() -> None:
    chat, _ = chat_request({"model": "m", "messages": USER}, count_only=True)
    assert "max_tokens" not in chat


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=5),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(
                        ["type", "text", "role", "content", "source", "id", "name", "input",
                         "tool_use_id", "model", "messages", "max_tokens"]), inner,
                        max_size=4), max_leaves=12))
def test_any_json_is_translated_or_refused_with_a_messages_error(body: object) -> None:
    try:
        chat, _ = chat_request(body)
    except MessagesError:
        return
    json.dumps(chat)  # what is accepted is a JSON-ready chat body
    assert chat["messages"]


ASKED = Asked("claude-sonnet-4-5", ("END",))


def completion(message_: dict[str, Any], finish: str | None = "stop",
               **choice: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-1", "choices": [{"index": 0, "message": message_,
                                             "finish_reason": finish, **choice}],
            "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}}


def test_a_completion_becomes_a_message_naming_the_model_asked_for() -> None:
    out = message(completion({"role": "assistant", "content": "hello"}), ASKED, "msg_1", 99)
    assert out == {"id": "msg_1", "type": "message", "role": "assistant",
                   "model": "claude-sonnet-4-5", "content": [{"type": "text", "text": "hello"}],
                   "stop_reason": "end_turn", "stop_sequence": None,
                   "usage": {"input_tokens": 11, "output_tokens": 7}}


def test_tool_calls_become_tool_use_blocks_with_parsed_input() -> None:
    said = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "weather", "arguments": '{"city": "Paris"}'}},
        {"type": "function", "function": {"name": "broken", "arguments": "{not json"}}]}
    out = message(completion(said, "stop"), ASKED, "msg_2")
    assert out["content"] == [
        {"type": "tool_use", "id": "call_1", "name": "weather", "input": {"city": "Paris"}},
        {"type": "tool_use", "id": "toolu_msg_2_1", "name": "broken", "input": {}}]
    assert out["stop_reason"] == "tool_use"


@pytest.mark.parametrize(("finish", "extra", "reason", "sequence"), [
    ("stop", {}, "end_turn", None), ("length", {}, "max_tokens", None),
    ("tool_calls", {}, "tool_use", None), ("content_filter", {}, "refusal", None),
    (None, {}, "end_turn", None), ("stop", {"stop_reason": "END"}, "stop_sequence", "END"),
    ("stop", {"stop_reason": "OTHER"}, "end_turn", None),
])
def test_stop_reasons(finish: str | None, extra: dict[str, Any], reason: str,
                      sequence: str | None) -> None:
    out = message(completion({"role": "assistant", "content": "x"}, finish, **extra), ASKED, "m")
    assert (out["stop_reason"], out["stop_sequence"]) == (reason, sequence)


def test_no_usage_falls_back_to_the_estimate() -> None:
    out = message({"choices": [{"message": {"content": "x"}}]}, ASKED, "m", input_tokens=42)
    assert out["usage"] == {"input_tokens": 42, "output_tokens": 0}


@pytest.mark.parametrize(("status", "kind"), [
    (400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error"),
    (404, "not_found_error"), (408, "invalid_request_error"), (413, "request_too_large"),
    (429, "rate_limit_error"), (500, "api_error"), (502, "api_error"), (504, "api_error"),
    (508, "api_error"), (503, "overloaded_error"), (529, "overloaded_error"),
])
def test_error_types(status: int, kind: str) -> None:
    assert error_type(status) == kind
    assert error_object(status, "why") == {"type": "error",
                                           "error": {"type": kind, "message": "why"}}
