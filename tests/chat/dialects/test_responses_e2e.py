"""`POST /v1/responses` driven by the official openai client's `responses.create`, against a
real gateway (uvicorn on loopback) whose first route answers 500: mesh routes (nodes) and
provider routes alike, the fallback in the middle of every answer."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from meshroute_middleware.app.config import GatewayConfig
from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig
from meshroute_middleware.core.providers.config import parse_providers_config

from ...providers.gateway import ENV
from ...upstream import ServerThread
from .tool_upstream import ToolChat

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}


@dataclass
class Routes:
    url: str
    model: str  # what the client asks for
    first: ToolChat  # the route tried first: it answers 500
    second: ToolChat  # the fallback
    second_route: str  # x-meshroute-route of an answer from `second`

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0)

    def requests(self) -> dict[str, int]:
        counts: dict[str, int] = httpx.get(self.url + "/v1/routing").json()["requests"]
        return counts


def _settings(**extra: Any) -> ServeSettings:
    return ServeSettings(mdns=False, seed=3, router=RouterConfig(explore_share=0.0),
                         first_byte_timeout_s=2.0, connect_timeout_s=1.0,
                         state_file=":memory:", **extra)


def _mesh(stack: ExitStack, first: ToolChat, second: ToolChat) -> Routes:
    heads = [stack.enter_context(ServerThread(t.app())) for t in (first, second)]
    gateway = build_gateway(GatewayConfig.build(_settings(), {}))
    server = stack.enter_context(ServerThread(gateway.app))
    for node, head, tps in (("a", heads[0], 30.0), ("b", heads[1], 8.0)):
        joined = httpx.post(f"{server.url}/v1/nodes", json={
            "node_id": node, "model": "m", "start": 0, "end": 39, "layers": 40,
            "url": head.url, "tps": tps})
        assert joined.status_code in (200, 201), joined.text
    return Routes(server.url, "m", first, second, "m|b[0-39]")


def _providers(stack: ExitStack, first: ToolChat, second: ToolChat) -> Routes:
    bases = [stack.enter_context(ServerThread(t.app())).url + "/v1" for t in (first, second)]
    doc = {"routing": {"chain": ["fastco/big-model", "slowco/small-model"],
                       "strategy": "smartest"},
           "providers": [
               {"name": "fastco", "base_url": bases[0], "keys": ["env:FAST_A"],
                "models": [{"id": "big-model", "tier": "large", "context": 4096}]},
               {"name": "slowco", "base_url": bases[1], "keys": ["env:SLOW_A"],
                "models": [{"id": "small-model", "tier": "small", "context": 2048}]}]}
    config = GatewayConfig.build(_settings(providers=parse_providers_config(doc)), ENV)
    server = stack.enter_context(ServerThread(build_gateway(config).app))
    return Routes(server.url, "auto", first, second, "slowco/small-model#1")


@pytest.fixture(params=["mesh", "providers"])
def routes(request: pytest.FixtureRequest) -> Iterator[Routes]:
    with ExitStack() as stack:
        build = _mesh if request.param == "mesh" else _providers
        yield build(stack, ToolChat("A", status=500), ToolChat("B"))


def test_a_response_after_a_fallback(routes: Routes) -> None:
    raw = routes.client().responses.with_raw_response.create(
        model=routes.model, input="hi", instructions="be brief", max_output_tokens=50)
    response = raw.parse()
    assert raw.headers["x-meshroute-route"] == routes.second_route
    assert routes.first.seen, "the first route was not tried"
    assert response.id.startswith("resp_") and response.object == "response"
    assert response.status == "completed" and response.model == routes.model
    assert response.output_text == "hello from B"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens,
            response.usage.total_tokens) == (7, 3, 10)
    sent = routes.second.seen[-1]
    assert sent["messages"] == [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "hi"}]
    assert sent["max_tokens"] == 50
    assert routes.requests()["answered"] == 1


def test_a_function_call_round_trip(routes: Routes) -> None:
    client = routes.client()
    asked: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    first = client.responses.create(model=routes.model, input=asked, tools=[WEATHER])
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and first.status == "completed"
    call = calls[0]
    assert (call.call_id, call.name, json.loads(call.arguments)) == (
        "call_1", "get_weather", {"city": "Paris"})
    assert routes.second.seen[-1]["tools"] == [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": WEATHER["parameters"]}}]
    history = [*asked, *[item.model_dump(exclude_none=True) for item in first.output],
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}]
    second = client.responses.create(model=routes.model, input=history, tools=[WEATHER])
    assert second.output_text == "B: the tool said sunny"
    messages = routes.second.seen[-1]["messages"]
    assert messages[1] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {
            "name": "get_weather", "arguments": '{"city": "Paris"}'}}]}
    assert messages[2] == {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}


def test_a_streamed_response_as_the_sdk_parses_it(routes: Routes) -> None:
    events = list(routes.client().responses.create(model=routes.model, input="hi",
                                                   stream=True))
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = events[-1]
    assert done.type == "response.completed"
    assert deltas == done.response.output_text == "hello from B"
    assert done.response.model == routes.model and done.response.status == "completed"
    assert done.response.usage is not None and done.response.usage.input_tokens == 7
    assert len({e.response.id for e in events if hasattr(e, "response")}) == 1
    assert routes.first.seen and routes.second.seen[-1]["stream_options"] == {
        "include_usage": True}
    assert routes.requests()["answered"] == 1


@pytest.mark.parametrize("tools", [[], [WEATHER]])
def test_the_sdks_stream_helper_accumulates_the_events(routes: Routes,
                                                       tools: list[Any]) -> None:
    """`responses.stream()` rebuilds the response from the events, checking their order."""
    with routes.client().responses.stream(model=routes.model, input="hi",
                                          tools=tools) as stream:
        deltas = [e for e in stream if e.type == "response.output_text.delta"]
        final = stream.get_final_response()
    texts = [e.delta for e in deltas]
    assert [e.snapshot for e in deltas[-1:]] == ["".join(texts)][:len(deltas)]
    if tools:
        call = final.output[0]
        assert call.type == "function_call" and json.loads(call.arguments) == {
            "city": "Paris"}
    else:
        assert final.output_text == "".join(texts) == "hello from B"


def test_a_streamed_function_call_round_trip(routes: Routes) -> None:
    client = routes.client()
    events = list(client.responses.create(model=routes.model, input="weather?",
                                          tools=[WEATHER], stream=True))
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    added, done = events[2], events[-1]
    assert added.item.type == "function_call" and added.item.name == "get_weather"
    pieces = "".join(e.delta for e in events
                     if e.type == "response.function_call_arguments.delta")
    call = done.response.output[0]
    assert call.type == "function_call" and call.arguments == pieces
    assert json.loads(pieces) == {"city": "Paris"} and call.call_id == "call_1"
    answer = list(client.responses.create(model=routes.model, stream=True, tools=[WEATHER],
                                          input=[{"role": "user", "content": "weather?"},
                                                 call.model_dump(exclude_none=True),
                                                 {"type": "function_call_output",
                                                  "call_id": "call_1", "output": "rain"}]))
    assert answer[-1].type == "response.completed"
    assert answer[-1].response.output_text == "B: the tool said rain"


PATCH = "*** Begin Patch\n*** Add File: a.txt\n+hi \"there\"\n*** End Patch\n"
APPLY_PATCH = {"type": "custom", "name": "apply_patch", "description": "Edit files.",
               "format": {"type": "grammar", "syntax": "lark",
                          "definition": 'start: "*** Begin Patch" /(.|\\n)*/'}}


@pytest.mark.parametrize("stream", [False, True])
def test_a_custom_tool_round_trip_as_codex_makes_it(routes: Routes, stream: bool) -> None:
    """Codex's freeform apply_patch: a function of one string to the route, a custom tool
    call to the client."""
    wrapped = json.dumps({"input": PATCH})
    routes.second.arguments = [wrapped[:20], wrapped[20:]]
    client = routes.client()
    asked: list[Any] = [{"role": "user", "content": "add a.txt"}]
    if stream:
        events = list(client.responses.create(model=routes.model, input=asked,
                                              tools=[APPLY_PATCH], stream=True))
        kinds = [e.type for e in events]
        assert "response.function_call_arguments.delta" not in kinds
        assert kinds[-4:-1] == ["response.custom_tool_call_input.delta",
                                "response.custom_tool_call_input.done",
                                "response.output_item.done"]
        assert events[-2].item.type == "custom_tool_call" and events[-2].item.input == PATCH
        output = events[-1].response.output
    else:
        output = client.responses.create(model=routes.model, input=asked,
                                          tools=[APPLY_PATCH]).output
    call = output[0]
    assert (call.type, call.name, call.call_id, call.input) == (
        "custom_tool_call", "apply_patch", "call_1", PATCH)
    function = routes.second.seen[-1]["tools"][0]["function"]
    assert function["name"] == "apply_patch" and "lark grammar" in function["description"]
    assert function["parameters"]["required"] == ["input"]
    answer = client.responses.create(model=routes.model, tools=[APPLY_PATCH], input=[
        *asked, call.model_dump(exclude_none=True),
        {"type": "custom_tool_call_output", "call_id": "call_1", "output": "Done!"}])
    assert answer.output_text == "B: the tool said Done!"
    assert routes.second.seen[-1]["messages"][1]["tool_calls"][0]["function"] == {
        "name": "apply_patch", "arguments": wrapped}


def test_the_token_limit_makes_an_incomplete_response(routes: Routes) -> None:
    client = routes.client()
    cut = client.responses.create(model=routes.model, input="hi", max_output_tokens=2)
    assert cut.status == "incomplete" and cut.output_text == "hello from "
    assert cut.incomplete_details is not None
    assert cut.incomplete_details.reason == "max_output_tokens"
    events = list(client.responses.create(model=routes.model, input="hi",
                                          max_output_tokens=2, stream=True))
    assert events[-1].type == "response.incomplete"
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"


def test_a_stream_broken_mid_way_ends_in_response_failed(routes: Routes) -> None:
    routes.second.break_after = 2  # the role chunk and one token, then the connection drops
    routes.second.break_when = seen = threading.Event()
    events = []
    for event in routes.client().responses.create(model=routes.model, input="hi",
                                                  stream=True):
        events.append(event)
        if event.type == "response.output_text.delta":
            seen.set()
    kinds = [e.type for e in events]
    assert kinds[-2:] == ["error", "response.failed"]
    assert "response.completed" not in kinds and "response.output_text.delta" in kinds
    failed = events[-1].response
    assert failed.status == "failed" and failed.error is not None
    assert "mid-stream" in failed.error.message
    assert failed.output[0].status == "incomplete"
    assert routes.requests() == {"answered": 0, "failed": 1}  # counted by the chat path


@pytest.mark.parametrize(("extra", "param", "words"), [
    ({"previous_response_id": "resp_123"}, "previous_response_id", "stateless"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type", "function tools only"),
    ({"tools": [WEATHER, {"type": "code_interpreter", "container": {"type": "auto"}}]},
     "tools[1].type", "function tools only"),
    ({"background": True}, "background", "stateless"),
])
def test_what_a_stateless_gateway_cannot_do_is_refused(
        routes: Routes, extra: dict[str, Any], param: str, words: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        routes.client().responses.create(model=routes.model, input="hi", **extra)
    error = caught.value
    assert error.status_code == 400 and error.code == "unsupported_parameter"
    assert error.param == param and words in error.message
    assert error.type == "invalid_request_error"
    assert routes.first.seen == [] and routes.second.seen == []


@pytest.mark.parametrize(("body", "param", "code"), [
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content", "invalid_type"),
    ({"input": "hi", "temperature": "hot"}, "temperature", "invalid_type"),
    ({"input": "hi", "tools": [{"type": "function", "name": ""}]}, "tools[0].name",
     "missing_required_parameter"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id",
     "missing_required_parameter"),
    ({}, "input", "missing_required_parameter"),
])
def test_a_malformed_request_gets_a_400_naming_the_field(
        routes: Routes, body: dict[str, Any], param: str, code: str) -> None:
    answer = httpx.post(routes.url + "/v1/responses", json={"model": routes.model, **body})
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (
        param, code, "invalid_request_error")
    assert param.split(".")[0].split("[")[0] in error["message"]


def test_a_request_as_codex_sends_it(routes: Routes) -> None:
    """Codex's request body (codex-rs ResponsesApiRequest): every field it sends is taken."""
    body = {
        "model": routes.model, "instructions": "You are a coding agent.",
        "input": [{"type": "message", "role": "developer",
                   "content": [{"type": "input_text", "text": "<permissions>"}]},
                  {"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "add a.txt"}]}],
        "tools": [WEATHER, APPLY_PATCH], "tool_choice": "auto", "parallel_tool_calls": False,
        "reasoning": {"effort": "medium", "summary": "auto"}, "store": False, "stream": True,
        "include": ["reasoning.encrypted_content"], "prompt_cache_key": "thread-1",
        "text": {"verbosity": "medium"}, "client_metadata": {"x-codex-turn": "1"}}
    with httpx.stream("POST", routes.url + "/v1/responses", json=body, timeout=30) as answer:
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        kinds = [line[len("event: "):] for line in answer.iter_lines()
                 if line.startswith("event: ")]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    sent = routes.second.seen[-1]
    assert [m["role"] for m in sent["messages"]] == ["system", "system", "user"]
    assert sent["parallel_tool_calls"] is False and "reasoning" not in sent


def test_chat_path_errors_pass_in_openai_shape(routes: Routes) -> None:
    routes.second.status = 500  # every route fails: the chat path's exhaustion, untouched
    chat = httpx.post(routes.url + "/v1/chat/completions", timeout=30,
                      json={"model": routes.model, "messages": [{"role": "user",
                                                                 "content": "hi"}]})
    answer = httpx.post(routes.url + "/v1/responses", timeout=30,
                        json={"model": routes.model, "input": "hi"})
    assert answer.status_code == chat.status_code and answer.status_code >= 429
    assert answer.json() == chat.json()  # the same OpenAI-shaped error, routes and all
    unknown = httpx.post(routes.url + "/v1/responses",
                         json={"model": "no-such-model", "input": "hi"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    bad_json = httpx.post(routes.url + "/v1/responses", content=b"{nope",
                          headers={"content-type": "application/json"})
    assert bad_json.status_code == 400 and bad_json.json()["error"]["code"] == "invalid_json"


def test_the_chat_path_is_unchanged_beside_it(routes: Routes) -> None:
    chat = routes.client().chat.completions.create(
        model=routes.model, messages=[{"role": "user", "content": "hi"}])
    assert chat.object == "chat.completion" and chat.choices[0].message.content == (
        "hello from B")
