"""A chat answer as a Responses answer: the `response` object and the stream's events."""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshroute_middleware.chat.dialects.wire.responses_answer import (
    ResponsesAnswerError,
    ResponsesStream,
    encode_events,
    from_completion,
)
from meshroute_middleware.chat.dialects.wire.responses_request import Echo

ECHO = Echo("client-model", instructions="be brief", max_output_tokens=99)
RID = "resp_abc"


def completion(message: dict[str, Any], finish: str = "stop",
               usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion", "model": "route-model",
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            **({} if usage is None else {"usage": usage})}


def test_a_text_answer() -> None:
    answer = from_completion(completion(
        {"role": "assistant", "content": "hello"}, usage={
            "prompt_tokens": 5, "completion_tokens": 2, "total_tokens": 7,
            "prompt_tokens_details": {"cached_tokens": 3}}), ECHO, RID, 1700)
    assert answer["id"] == RID and answer["object"] == "response"
    assert answer["created_at"] == 1700 and answer["status"] == "completed"
    assert answer["model"] == "client-model"  # the name the client asked for
    assert answer["incomplete_details"] is None and answer["error"] is None
    assert answer["instructions"] == "be brief" and answer["max_output_tokens"] == 99
    assert answer["store"] is False
    assert answer["output"] == [{"id": "msg_abc_0", "type": "message", "status": "completed",
                                 "role": "assistant", "content": [{
                                     "type": "output_text", "text": "hello",
                                     "annotations": [], "logprobs": []}]}]
    assert answer["usage"] == {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 3},
                               "output_tokens": 2,
                               "output_tokens_details": {"reasoning_tokens": 0},
                               "total_tokens": 7}


def test_tool_calls_become_function_call_items() -> None:
    answer = from_completion(completion({"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "a", "arguments": "{}"}},
        {"id": "call_2", "type": "function",
         "function": {"name": "b", "arguments": '{"x":1}'}}]}, "tool_calls"), ECHO, RID, 0)
    assert [(i["type"], i["call_id"], i["name"], i["arguments"], i["status"])
            for i in answer["output"]] == [
        ("function_call", "call_1", "a", "{}", "completed"),
        ("function_call", "call_2", "b", '{"x":1}', "completed")]
    assert len({i["id"] for i in answer["output"]}) == 2
    assert answer["usage"] is None  # the route reported none


@pytest.mark.parametrize(("finish", "reason"), [("length", "max_output_tokens"),
                                                ("content_filter", "content_filter")])
def test_a_cut_answer_is_incomplete(finish: str, reason: str) -> None:
    answer = from_completion(completion({"content": "hel"}, finish), ECHO, RID, 0)
    assert answer["status"] == "incomplete"
    assert answer["incomplete_details"] == {"reason": reason}
    assert answer["output"][0]["status"] == "incomplete"


def test_a_refusal_and_text_parts() -> None:
    refused = from_completion(completion({"content": None, "refusal": "no"}), ECHO, RID, 0)
    assert refused["output"][0]["content"] == [{"type": "refusal", "refusal": "no"}]
    parts = from_completion(completion({"content": [{"type": "text", "text": "a"},
                                                    {"type": "text", "text": "b"}]}),
                            ECHO, RID, 0)
    assert parts["output"][0]["content"][0]["text"] == "ab"
    empty = from_completion(completion({"content": ""}), ECHO, RID, 0)
    assert empty["output"] == []


@pytest.mark.parametrize("body", [{}, {"choices": []}, {"choices": ["x"]}, [],
                                  {"choices": [{"message": {"tool_calls": [3]}}]}])
def test_what_is_no_completion_is_refused(body: Any) -> None:
    with pytest.raises(ResponsesAnswerError):
        from_completion(body, ECHO, RID, 0)


def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def run(stream: ResponsesStream, chunks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    events = stream.start()
    for c in chunks:
        events += stream.chunk(c)
    return events + stream.end()


def test_a_text_stream() -> None:
    events = run(ResponsesStream(ECHO, RID, 5), [
        chunk({"role": "assistant", "content": ""}), chunk({"content": "hel"}),
        chunk({"content": "lo"}), chunk({}, "stop"),
        {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}])
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert events[2]["item"]["content"] == []  # the part comes with content_part.added
    assert events[3]["part"] == {"type": "output_text", "text": "", "annotations": [],
                                 "logprobs": []}
    assert events[0]["response"]["status"] == "in_progress"
    assert events[0]["response"]["output"] == []
    assert events[6]["text"] == "hello" and events[8]["item"]["content"][0]["text"] == "hello"
    done = events[-1]["response"]
    assert done["status"] == "completed" and done["model"] == "client-model"
    assert done["output"][0]["content"][0]["text"] == "hello"
    assert done["usage"]["input_tokens"] == 4 and done["usage"]["total_tokens"] == 6
    assert len({e["item_id"] for e in events if "item_id" in e}) == 1


def test_text_then_parallel_tool_calls() -> None:
    def call(index: int, **fields: Any) -> dict[str, Any]:
        return chunk({"tool_calls": [{"index": index, **fields}]})
    events = run(ResponsesStream(ECHO, RID, 5), [
        chunk({"content": "Let me look."}),
        call(0, id="c1", type="function", function={"name": "a", "arguments": ""}),
        call(0, function={"arguments": '{"q":'}), call(0, function={"arguments": '"x"}'}),
        call(1, id="c2", type="function", function={"name": "b", "arguments": "{}"}),
        chunk({}, "tool_calls")])
    added = [e["item"] for e in events if e["type"] == "response.output_item.added"]
    assert [(i["type"], i.get("call_id"), i.get("name")) for i in added] == [
        ("message", None, None), ("function_call", "c1", "a"), ("function_call", "c2", "b")]
    deltas = [(e["output_index"], e["delta"]) for e in events
              if e["type"] == "response.function_call_arguments.delta"]
    assert deltas == [(1, '{"q":'), (1, '"x"}'), (2, "{}")]
    dones = {e["output_index"]: (e["name"], e["arguments"]) for e in events
             if e["type"] == "response.function_call_arguments.done"}
    assert dones == {1: ("a", '{"q":"x"}'), 2: ("b", "{}")}
    final = events[-1]["response"]["output"]
    assert [i["type"] for i in final] == ["message", "function_call", "function_call"]
    assert final[1]["arguments"] == '{"q":"x"}' and final[2]["call_id"] == "c2"


def test_the_closing_events_repeat_a_bounded_text_and_every_delta_passes() -> None:
    stream = ResponsesStream(ECHO, RID, 5, max_kept_chars=10)
    deltas = ["abcd"] * 3000 + ["efgh"]  # many more than are joined at once
    call = chunk({"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                  "function": {"name": "a", "arguments": '{"q":1}'}}]})
    events = run(stream, [*(chunk({"content": d}) for d in deltas), call, chunk({}, "stop")])
    passed = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert passed == deltas  # the client gets all of it as it streams
    assert stream.cut
    done = next(e for e in events if e["type"] == "response.output_text.done")
    assert done["text"] == "abcdabcdab"  # the first 10 characters
    final = events[-1]["response"]["output"]
    assert final[0]["content"][0]["text"] == "abcdabcdab"
    assert final[1]["arguments"] == ""  # no room left: its deltas passed, none kept


def test_under_the_bound_nothing_is_cut() -> None:
    stream = ResponsesStream(ECHO, RID, 5, max_kept_chars=3000 * 4)
    events = run(stream, [*(chunk({"content": "abcd"}) for _ in range(3000)),
                          chunk({}, "stop")])
    assert not stream.cut
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "abcd" * 3000


def test_a_cut_stream_is_incomplete() -> None:
    events = run(ResponsesStream(ECHO, RID, 5), [chunk({"content": "a"}), chunk({}, "length")])
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    assert events[-2]["item"]["status"] == "incomplete"


def test_a_failed_stream_and_what_comes_after() -> None:
    stream = ResponsesStream(ECHO, RID, 5)
    events = stream.start() + stream.chunk(chunk({"content": "par"}))
    failed = stream.fail("the route broke", "upstream_failed")
    assert [e["type"] for e in failed] == ["error", "response.failed"]
    assert failed[0]["code"] == "upstream_failed" and failed[0]["message"] == "the route broke"
    response = failed[1]["response"]
    assert response["status"] == "failed"
    assert response["error"] == {"code": "server_error", "message": "the route broke"}
    assert response["output"][0]["status"] == "incomplete"
    assert response["output"][0]["content"][0]["text"] == "par"
    assert stream.chunk(chunk({"content": "more"})) == [] and stream.end() == []
    assert failed[1]["sequence_number"] == len(events) + 1


@pytest.mark.parametrize("junk", [None, 3, "x", {"choices": "x"}, {"choices": [3]},
                                  {"choices": [{"delta": {"tool_calls": [3, {"index": "z"}]}}]},
                                  {"choices": [{"delta": {"content": 7}}]}])
def test_chunks_that_are_no_chat_chunks_are_skipped(junk: Any) -> None:
    stream = ResponsesStream(ECHO, RID, 5)
    stream.start()
    stream.chunk(junk)
    assert stream.end()[-1]["type"] == "response.completed"


def test_events_encode_as_sse() -> None:
    encoded = encode_events([{"type": "response.created", "sequence_number": 0}, {
        "type": "response.output_text.delta", "sequence_number": 1, "delta": "a\nb"}])
    blocks = encoded.split(b"\n\n")
    assert blocks[-1] == b"" and len(blocks) == 3
    head, data = blocks[1].split(b"\n")
    assert head == b"event: response.output_text.delta"
    assert json.loads(data.removeprefix(b"data: "))["delta"] == "a\nb"


CUSTOM = Echo("m", custom_tools=frozenset({"apply_patch"}))


def test_a_custom_tools_call_answers_as_a_custom_tool_call() -> None:
    answer = from_completion(completion({"content": None, "tool_calls": [
        {"id": "c1", "type": "function", "function": {
            "name": "apply_patch", "arguments": '{"input": "*** Begin Patch"}'}},
        {"id": "c2", "type": "function", "function": {
            "name": "apply_patch", "arguments": "not json"}}]}, "tool_calls"), CUSTOM, RID, 0)
    assert [(i["type"], i["call_id"], i["input"]) for i in answer["output"]] == [
        ("custom_tool_call", "c1", "*** Begin Patch"), ("custom_tool_call", "c2", "not json")]


def test_a_streamed_custom_tool_call_is_told_whole_at_its_end() -> None:
    events = run(ResponsesStream(CUSTOM, RID, 0), [
        chunk({"tool_calls": [{"index": 0, "id": "c1", "function": {
            "name": "apply_patch", "arguments": '{"inp'}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": 'ut": "x\\ny"}'}}]}),
        chunk({}, "tool_calls")])
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.custom_tool_call_input.delta", "response.custom_tool_call_input.done",
        "response.output_item.done", "response.completed"]
    assert events[2]["item"]["type"] == "custom_tool_call"
    assert events[3]["delta"] == events[4]["input"] == "x\ny"
    assert events[-1]["response"]["output"][0]["input"] == "x\ny"
