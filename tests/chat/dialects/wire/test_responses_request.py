"""A Responses request as a chat-completions request: what is translated, what is refused."""

from __future__ import annotations

from typing import Any

import pytest

from meshroute_middleware.chat.dialects.wire.responses_request import (
    ResponsesRequestError,
    to_chat,
)

IMAGE = "data:image/png;base64,iVBORw0KGgo="


def chat(**payload: Any) -> dict[str, Any]:
    return to_chat({"model": "m", **payload})[0]


def test_a_string_input_and_instructions() -> None:
    assert chat(input="hi", instructions="be brief") == {"model": "m", "messages": [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}


def test_message_items_with_parts_and_roles() -> None:
    body = chat(input=[
        {"role": "developer", "content": [{"type": "input_text", "text": "rules"}]},
        {"type": "message", "role": "user", "content": [
            {"type": "input_text", "text": "what is this?"},
            {"type": "input_image", "image_url": IMAGE, "detail": "low"}]},
        {"type": "message", "role": "assistant", "content": [
            {"type": "output_text", "text": "a ", "annotations": []},
            {"type": "output_text", "text": "cat"}]},
        {"role": "user", "content": [{"type": "input_text", "text": "sure?"}]},
    ])
    assert body["messages"] == [
        {"role": "system", "content": "rules"},
        {"role": "user", "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": IMAGE, "detail": "low"}}]},
        {"role": "assistant", "content": "a cat"},
        {"role": "user", "content": "sure?"}]


def test_function_calls_and_their_outputs() -> None:
    body = chat(input=[
        {"role": "user", "content": "weather in Paris and Rome?"},
        {"type": "message", "role": "assistant", "content": "Looking."},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "weather",
         "arguments": '{"city":"Paris"}', "status": "completed"},
        {"type": "function_call", "call_id": "c2", "name": "weather",
         "arguments": '{"city":"Rome"}'},
        {"type": "function_call_output", "call_id": "c1", "output": "sun"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "rain"}]},
        {"type": "reasoning", "id": "rs_1", "summary": []},  # handed back; dropped
        {"type": "function_call", "call_id": "c3", "name": "weather", "arguments": "{}"},
    ])
    calls = [{"id": c, "type": "function", "function": {"name": "weather", "arguments": a}}
             for c, a in (("c1", '{"city":"Paris"}'), ("c2", '{"city":"Rome"}'))]
    assert body["messages"] == [
        {"role": "user", "content": "weather in Paris and Rome?"},
        {"role": "assistant", "content": "Looking.", "tool_calls": calls},
        {"role": "tool", "tool_call_id": "c1", "content": "sun"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c3", "type": "function", "function": {"name": "weather",
                                                          "arguments": "{}"}}]}]


def test_tools_choice_limits_sampling_and_stream() -> None:
    body, echo = to_chat({
        "model": "m", "input": "hi", "max_output_tokens": 64, "temperature": 0.2,
        "top_p": 1, "stream": True, "parallel_tool_calls": False, "user": "u1",
        "tools": [{"type": "function", "name": "f", "description": "d",
                   "parameters": {"type": "object"}, "strict": True}],
        "tool_choice": {"type": "function", "name": "f"}, "store": False,
        "text": {"format": {"type": "json_schema", "name": "out",
                            "schema": {"type": "object"}, "strict": True}}})
    assert body == {
        "model": "m", "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "f", "description": "d",
                                                    "parameters": {"type": "object"},
                                                    "strict": True}}],
        "tool_choice": {"type": "function", "function": {"name": "f"}}, "max_tokens": 64,
        "temperature": 0.2, "top_p": 1, "stream": True,
        "stream_options": {"include_usage": True}, "parallel_tool_calls": False,
        "user": "u1", "response_format": {"type": "json_schema", "json_schema": {
            "name": "out", "schema": {"type": "object"}, "strict": True}}}
    assert echo.stream and echo.max_output_tokens == 64 and not echo.parallel_tool_calls
    assert echo.tools[0]["name"] == "f" and echo.tool_choice == {"type": "function",
                                                                  "name": "f"}


@pytest.mark.parametrize("choice", ["auto", "none", "required"])
def test_tool_choice_modes_pass(choice: str) -> None:
    assert chat(input="hi", tool_choice=choice)["tool_choice"] == choice


def test_other_fields_are_accepted_without_effect() -> None:
    """What Codex sends beside the translated fields, store=true (OpenAI's default) and a
    field no one knows yet: accepted, and the chat request is the same."""
    assert chat(input="hi", include=["reasoning.encrypted_content"], store=True,
                reasoning={"effort": "low", "summary": "auto"}, metadata={"a": "b"},
                truncation="auto", prompt_cache_key="k", service_tier="auto",
                client_metadata={"x": "y"}, text={"verbosity": "low"},
                some_future_field=1) == chat(input="hi")


def test_meshroutes_own_pin_passes_to_the_chat_path() -> None:
    assert chat(input="hi", route=["a"])["route"] == ["a"]


@pytest.mark.parametrize(("payload", "param", "code", "words"), [
    ({"previous_response_id": "resp_1"}, "previous_response_id", "unsupported_parameter",
     "stateless"),
    ({"conversation": "conv_1"}, "conversation", "unsupported_parameter", "stateless"),
    ({"background": True}, "background", "unsupported_parameter", "stateless"),
    ({"tools": [{"type": "web_search_preview"}]}, "tools[0].type", "unsupported_parameter",
     "function tools only"),
    ({"tools": [{"type": "file_search", "vector_store_ids": ["v"]}]}, "tools[0].type",
     "unsupported_parameter", "function tools only"),
    ({"tools": [{"type": "computer_use_preview"}]}, "tools[0].type",
     "unsupported_parameter", "'computer_use_preview'"),
    ({"tool_choice": {"type": "web_search"}}, "tool_choice", "unsupported_parameter",
     "function tools only"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0]",
     "unsupported_parameter", "stateless"),
    ({"input": [{"type": "web_search_call", "id": "ws"}]}, "input[0].type",
     "unsupported_parameter", "function_call_output"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]},
     "input[0].content[0].file_id", "unsupported_parameter", "stateless"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_data": "x"}]}]},
     "input[0].content[0].type", "unsupported_parameter", "input_file"),
])
def test_what_needs_state_or_built_in_tools_is_refused(
        payload: dict[str, Any], param: str, code: str, words: str) -> None:
    with pytest.raises(ResponsesRequestError) as caught:
        to_chat({"model": "m", "input": "hi", **payload})
    assert (caught.value.param, caught.value.code) == (param, code)
    assert words in str(caught.value)


@pytest.mark.parametrize(("payload", "param", "code"), [
    ({"input": "hi"}, "model", "missing_required_parameter"),
    ({"model": "", "input": "hi"}, "model", "missing_required_parameter"),
    ({"model": "m"}, "input", "missing_required_parameter"),
    ({"model": "m", "input": 3}, "input", "invalid_type"),
    ({"model": "m", "input": ["hi"]}, "input[0]", "invalid_type"),
    ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "input[0].role",
     "invalid_value"),
    ({"model": "m", "input": [{"role": ["user"], "content": "x"}]}, "input[0].role",
     "invalid_value"),
    ({"model": "m", "input": [{"role": "user", "content": {"text": "x"}}]},
     "input[0].content", "invalid_type"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text"}]}]},
     "input[0].content[0].text", "invalid_type"),
    ({"model": "m", "input": [{"role": "system", "content": [
        {"type": "input_image", "image_url": IMAGE}]}]}, "input[0].content", "invalid_value"),
    ({"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]},
     "input[0].call_id", "missing_required_parameter"),
    ({"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f",
                               "arguments": {"a": 1}}]}, "input[0].arguments", "invalid_type"),
    ({"model": "m", "input": [{"type": "function_call_output", "call_id": "c",
                               "output": 3}]}, "input[0].output", "invalid_type"),
    ({"model": "m", "input": "hi", "tools": {"type": "function"}}, "tools", "invalid_type"),
    ({"model": "m", "input": "hi", "tools": [{"type": "function"}]}, "tools[0].name",
     "missing_required_parameter"),
    ({"model": "m", "input": "hi", "max_output_tokens": 0}, "max_output_tokens",
     "invalid_type"),
    ({"model": "m", "input": "hi", "max_output_tokens": True}, "max_output_tokens",
     "invalid_type"),
    ({"model": "m", "input": "hi", "temperature": "warm"}, "temperature", "invalid_type"),
    ({"model": "m", "input": "hi", "stream": "yes"}, "stream", "invalid_type"),
    ({"model": "m", "input": "hi", "store": "no"}, "store", "invalid_type"),
    ({"model": "m", "input": "hi", "instructions": ["a"]}, "instructions", "invalid_type"),
    ({"model": "m", "input": "hi", "tool_choice": "any"}, "tool_choice",
     "unsupported_parameter"),
    ({"model": "m", "input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type",
     "invalid_value"),
])
def test_a_malformed_request_names_its_field(payload: dict[str, Any], param: str,
                                             code: str) -> None:
    with pytest.raises(ResponsesRequestError) as caught:
        to_chat(payload)
    assert (caught.value.param, caught.value.code) == (param, code)
    assert param.split("[")[0].split(".")[0] in str(caught.value)


def test_a_custom_tool_is_a_function_of_one_string() -> None:
    body, echo = to_chat({"model": "m", "tools": [
        {"type": "custom", "name": "apply_patch", "description": "Edit files.",
         "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}},
        {"type": "custom", "name": "note"}],
        "tool_choice": {"type": "custom", "name": "note"}, "input": [
            {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch",
             "input": 'a "patch"'},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "ok"}]})
    patch, note = (t["function"] for t in body["tools"])
    assert patch["name"] == "apply_patch"
    assert patch["description"] == "Edit files.\n\nThe input must match this lark grammar:\n" \
                                   "start: /.+/"
    assert patch["parameters"]["properties"]["input"]["type"] == "string"
    assert note == {"name": "note", "description": "", "parameters": patch["parameters"]}
    assert body["tool_choice"] == {"type": "function", "function": {"name": "note"}}
    assert body["messages"] == [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {
                "name": "apply_patch", "arguments": '{"input": "a \\"patch\\""}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]
    assert echo.custom_tools == {"apply_patch", "note"}


def test_two_tools_of_one_name_are_refused() -> None:
    with pytest.raises(ResponsesRequestError) as caught:
        chat(input="hi", tools=[{"type": "function", "name": "f"},
                                {"type": "custom", "name": "f"}])
    assert caught.value.param == "tools"


def test_what_is_quoted_back_is_bounded() -> None:
    for payload in ({"tools": [{"type": "y" * 10_000}]}, {"input": [{"type": "z" * 10_000}]},
                    {"input": [{"role": "user", "content": [{"type": "w" * 10_000}]}]}):
        with pytest.raises(ResponsesRequestError) as caught:
            to_chat({"model": "m", "input": "hi", **payload})
        assert len(str(caught.value)) < 400 and len(caught.value.param) < 100


def test_images_a_tool_returned_follow_its_turns_tool_messages() -> None:
    image = {"type": "input_image", "image_url": IMAGE}
    body = chat(input=[
        {"type": "function_call", "call_id": "a", "name": "view_image", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "view_image", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": [image]},
        {"type": "function_call_output", "call_id": "b",
         "output": [{"type": "input_text", "text": "two:"}, image]},
        {"role": "user", "content": "what are they?"}])
    roles = [(m["role"], m.get("tool_call_id")) for m in body["messages"]]
    assert roles == [("assistant", None), ("tool", "a"), ("tool", "b"), ("user", None),
                     ("user", None)]
    assert body["messages"][1]["content"].startswith("(the tool's output is the image")
    assert body["messages"][2]["content"] == "two:"
    assert body["messages"][3]["content"] == [
        {"type": "image_url", "image_url": {"url": IMAGE}}] * 2
    last = chat(input=[{"type": "function_call_output", "call_id": "a", "output": [image]}])
    assert [m["role"] for m in last["messages"]] == ["tool", "user"]
