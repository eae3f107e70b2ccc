"""/v1/messages with the official anthropic client over provider routes (fake providers on
loopback ports), with a fallback in the middle: the first route answers 500."""

from __future__ import annotations

import base64
import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

from meshroute_middleware.core.providers.tokens import estimate

from ...providers.fake_anthropic import FakeAnthropic
from ...providers.fake_provider import FakeProvider, Reply
from ...providers.gateway import ENV, Running, gateway, providers_doc
from ...upstream import FakeChat, ServerThread

HI = [{"role": "user", "content": "hi"}]
WEATHER = {"name": "weather", "description": "the weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                            "required": ["city"]}}
FALLBACK = "fastco/big-model#1,slowco/small-model#1"


def events(gw: Running, wanted: int) -> list[dict[str, Any]]:
    """The first `wanted` events of /v1/routing/events."""
    out: list[dict[str, Any]] = []
    with httpx.stream("GET", f"{gw.url}/v1/routing/events", timeout=10) as resp:
        for line in resp.iter_lines():
            if line.startswith("data: "):
                out.append(json.loads(line[6:]))
                if len(out) == wanted:
                    break
    return out


def client(gw: Running) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=gw.url, api_key="unused", max_retries=0)


@pytest.fixture
def gw(providers: tuple[FakeProvider, FakeProvider]) -> Any:
    fast, slow = providers
    with gateway(providers_doc(fast, slow)) as running:
        yield running


def test_a_message_after_a_fallback(gw: Running,
                                    providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.push(Reply.error(500))
    raw = client(gw).messages.with_raw_response.create(
        model="auto", max_tokens=64, system="be brief", messages=HI)
    msg = raw.parse()
    assert raw.headers["x-meshroute-tried"] == FALLBACK
    assert msg.id.startswith("msg_") and msg.type == "message" and msg.role == "assistant"
    assert msg.model == "auto"  # the model the client asked for
    assert [b.type for b in msg.content] == ["text"]
    assert msg.content[0].text == "t0 t1 t2 t3 t4 t5 t6 t7"  # type: ignore[union-attr]
    assert msg.stop_reason == "end_turn"
    assert (msg.usage.input_tokens, msg.usage.output_tokens) == (5, 8)
    sent = slow.seen[-1].body
    assert sent["messages"] == [{"role": "system", "content": "be brief"}, *HI]
    assert sent["max_tokens"] == 64 and sent["model"] == "small-model"


def test_a_stream_after_a_fallback(gw: Running,
                                   providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.push(Reply.error(500))
    with client(gw).messages.stream(model="auto", max_tokens=64, messages=HI) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    for kind in ("text", "input_json"):  # the SDK's own derived events
        kinds = [k for k in kinds if k != kind]
    assert kinds == ["message_start", "content_block_start",
                     *["content_block_delta"] * 8, "content_block_stop", "message_delta",
                     "message_stop"]
    assert final.content[0].text == "t0 t1 t2 t3 t4 t5 t6 t7 "  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 8
    assert slow.seen[-1].body["stream_options"] == {"include_usage": True}
    with httpx.stream("POST", f"{gw.url}/v1/messages", timeout=10, json={
            "model": "auto", "max_tokens": 8, "stream": True, "messages": HI}) as resp:
        names = [line[7:] for line in resp.iter_lines() if line.startswith("event: ")]
        assert resp.headers["content-type"].startswith("text/event-stream")
    assert names[:2] == ["message_start", "ping"] and names[-1] == "message_stop"


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_use_round_trip(gw: Running, providers: tuple[FakeProvider, FakeProvider],
                               stream: bool) -> None:
    fast, slow = providers
    fast.push(Reply.error(500), Reply.error(500))
    asked: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    api = client(gw).messages
    if stream:
        with api.stream(model="auto", max_tokens=64, messages=asked, tools=[WEATHER]) as s:
            first = s.get_final_message()
    else:
        first = api.create(model="auto", max_tokens=64, messages=asked, tools=[WEATHER])
    assert first.stop_reason == "tool_use"
    use = first.content[-1]
    assert use.type == "tool_use" and use.name == "weather" and use.input == {"city": "mesh"}
    offered = slow.seen[-1].body["tools"]
    assert offered == [{"type": "function", "function": {
        "name": "weather", "description": WEATHER["description"],
        "parameters": WEATHER["input_schema"]}}]
    asked += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                            "content": "18 degrees"}]}]
    answer = api.create(model="auto", max_tokens=64, messages=asked, tools=[WEATHER])
    assert answer.stop_reason == "end_turn" and answer.content[0].type == "text"
    sent = slow.seen[-1].body["messages"]
    assert sent[1]["tool_calls"][0]["id"] == use.id
    assert json.loads(sent[1]["tool_calls"][0]["function"]["arguments"]) == {"city": "mesh"}
    assert sent[2] == {"role": "tool", "tool_call_id": use.id, "content": "18 degrees"}


def test_an_image_reaches_the_route_as_an_image_url_part(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    doc = providers_doc(fast, slow)
    for provider in doc["providers"]:  # both take images (issue 25: capabilities)
        provider["models"][0]["capabilities"] = ["vision"]
    fast.push(Reply.error(500))
    png = base64.b64encode(b"\x89PNG\r\n\x1a\n a tiny picture").decode()
    with gateway(doc) as gw:
        msg = client(gw).messages.create(model="auto", max_tokens=16, messages=[{
            "role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                             "data": png}},
                {"type": "text", "text": "what is it?"}]}])
    assert msg.content[0].type == "text"
    assert slow.seen[-1].body["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}},
        {"type": "text", "text": "what is it?"}]


def test_count_tokens_is_answered_locally(gw: Running,
                                          providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    messages = [{"role": "user", "content": "how many tokens are in this sentence?"}]
    counted = client(gw).messages.count_tokens(model="auto", system="be brief",
                                               messages=messages)
    expected = estimate({"messages": [{"role": "system", "content": "be brief"}, *messages]})
    assert counted.input_tokens == expected.prompt > 0
    assert fast.seen == [] and slow.seen == []  # routed nowhere
    with pytest.raises(anthropic.BadRequestError):
        client(gw).messages.count_tokens(model="auto", messages=[])


def test_errors_in_anthropic_shape(gw: Running,
                                   providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    api = client(gw).messages
    with pytest.raises(anthropic.BadRequestError) as bad:
        api.create(model="auto", max_tokens=0, messages=HI)
    assert bad.value.body == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "max_tokens: a positive integer is required"}}
    with pytest.raises(anthropic.NotFoundError) as missing:
        api.create(model="no-such-model", max_tokens=8, messages=HI)
    assert missing.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    fast.default = slow.default = Reply.rate_limited("7")
    with pytest.raises(anthropic.RateLimitError) as limited:
        api.create(model="auto", max_tokens=8, messages=HI)
    assert limited.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert limited.value.response.headers["retry-after"] == "7"
    assert "x-meshroute-tried" in limited.value.response.headers
    not_json = httpx.post(f"{gw.url}/v1/messages", content=b"{not json", timeout=10)
    assert not_json.status_code == 400
    assert not_json.json()["type"] == "error"
    assert not_json.json()["error"]["type"] == "invalid_request_error"


def test_a_body_too_large_is_refused_before_it_is_read_in_anthropic_shape(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    with (gateway(providers_doc(fast, slow), max_body_bytes=2048) as gw,
          pytest.raises(anthropic.RequestTooLargeError) as big):
            client(gw).messages.create(model="auto", max_tokens=8,
                                       messages=[{"role": "user", "content": "x" * 4096}])
    assert big.value.status_code == 413
    assert big.value.body["error"]["type"] == "request_too_large"  # type: ignore[index]


@pytest.fixture
def claude() -> Any:
    fake = FakeAnthropic()
    with fake.serve():
        yield fake


def native_doc(claude: FakeAnthropic, fast: FakeProvider,
               slow: FakeProvider) -> dict[str, Any]:
    doc = providers_doc(fast, slow, chain=("claudeco/claude-real", "slowco/small-model"))
    doc["providers"].append({"name": "claudeco", "base_url": claude.base_url,
                             "keys": ["env:SLOW_A"],
                             "models": [{"id": "claude-real", "tier": "frontier",
                                         "api": "anthropic"}]})
    return doc


def test_an_anthropic_provider_gets_the_request_untranslated(
        claude: FakeAnthropic, providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    body = {"model": "auto", "max_tokens": 32, "system": [{"type": "text", "text": "brief"}],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}],
            "top_k": 3}
    with gateway(native_doc(claude, fast, slow)) as gw:
        answer = httpx.post(f"{gw.url}/v1/messages", json=body, timeout=10,
                            headers={"anthropic-version": "2023-06-01",
                                     "anthropic-beta": "tools-2024-05-16",
                                     "x-api-key": "the-clients-own-key"})
        with client(gw).messages.stream(**{k: v for k, v in body.items() if k != "top_k"}) \
                as stream:
            text = stream.get_final_text()
            final = stream.get_final_message()
        outcomes = [e for e in events(gw, 4) if e["type"] == "outcome"]
    assert answer.status_code == 200, answer.text
    assert answer.json()["id"] == "msg_fake"  # relayed as it came
    assert answer.headers["x-meshroute-route"] == "claudeco/claude-real#1"
    seen = claude.seen[0]
    assert seen["body"] == {**body, "model": "claude-real"}  # untranslated
    assert seen["headers"]["x-api-key"] == ENV["SLOW_A"]  # the provider's key, not the client's
    assert "authorization" not in seen["headers"]
    assert seen["headers"]["anthropic-version"] == "2023-06-01"
    assert seen["headers"]["anthropic-beta"] == "tools-2024-05-16"
    assert claude.seen[1]["headers"]["anthropic-version"]  # the SDK's own, or ours
    assert text == "hello from claude " and final.usage.output_tokens == 4
    assert slow.seen == []
    # measured from Anthropic's usage: output_tokens of the message and of the stream
    assert [(e["signature"], e["ok"], e["completion_tokens"]) for e in outcomes] == [
        ("claudeco/claude-real#1", True, 4)] * 2


def test_an_anthropic_provider_that_fails_falls_back_to_a_translated_route(
        claude: FakeAnthropic, providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    claude.status = 529
    with gateway(native_doc(claude, fast, slow)) as gw:
        raw = client(gw).messages.with_raw_response.create(model="auto", max_tokens=8,
                                                            messages=HI)
    assert raw.headers["x-meshroute-tried"] == "claudeco/claude-real#1,slowco/small-model#1"
    msg = raw.parse()
    assert msg.content[0].text == "t0 t1 t2 t3 t4 t5 t6 t7"  # type: ignore[union-attr]
    assert msg.model == "auto"


def test_a_chat_request_reaches_an_anthropic_model_translated_to_messages(
        claude: FakeAnthropic, providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    chat = openai.OpenAI  # the chat-completions client, against the same gateway
    with gateway(native_doc(claude, fast, slow)) as gw:
        api = chat(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0).chat.completions
        raw = api.with_raw_response.create(model="auto", max_tokens=20, stop=["END"],
                                           messages=[{"role": "system", "content": "brief"},
                                                     {"role": "user", "content": "hi"}])
        stream = api.create(model="auto", stream=True, stream_options={"include_usage": True},
                            messages=[{"role": "user", "content": "hi"}])
        chunks = list(stream)
        outcomes = [e for e in events(gw, 4) if e["type"] == "outcome"]
    answer = raw.parse()
    assert raw.headers["x-meshroute-route"] == "claudeco/claude-real#1"
    assert answer.choices[0].message.content == "hello from claude"
    assert answer.choices[0].finish_reason == "stop"
    assert answer.usage is not None and answer.usage.completion_tokens == 4
    assert claude.seen[0]["body"] == {
        "model": "claude-real", "system": "brief", "max_tokens": 20,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        "stop_sequences": ["END"]}
    assert claude.seen[0]["headers"]["x-api-key"] == ENV["SLOW_A"]
    assert claude.seen[1]["body"]["max_tokens"] == 4096  # Messages requires one
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == \
        "hello from claude "
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4
    assert [(e["ok"], e["completion_tokens"]) for e in outcomes] == [(True, 4)] * 2
    assert slow.seen == []


@pytest.mark.parametrize("stream", [False, True])
def test_a_chat_tool_round_trip_over_an_anthropic_model(
        claude: FakeAnthropic, providers: tuple[FakeProvider, FakeProvider],
        stream: bool) -> None:
    fast, slow = providers
    tools: list[Any] = [{"type": "function", "function": {
        "name": "weather", "parameters": WEATHER["input_schema"]}}]
    asked: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    with gateway(native_doc(claude, fast, slow)) as gw:
        api = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused",
                            max_retries=0).chat.completions
        if stream:
            parts = list(api.create(model="auto", messages=asked, tools=tools, stream=True))
            calls = [c.choices[0].delta.tool_calls for c in parts
                     if c.choices and c.choices[0].delta.tool_calls]
            call_id, name = calls[0][0].id, calls[0][0].function.name  # type: ignore[union-attr]
            arguments = "".join(c[0].function.arguments or "" for c in calls)  # type: ignore[union-attr]
            assert parts[-1].choices[0].finish_reason == "tool_calls"
        else:
            first = api.create(model="auto", messages=asked, tools=tools)
            assert first.choices[0].finish_reason == "tool_calls"
            call = first.choices[0].message.tool_calls[0]  # type: ignore[index]
            call_id, name, arguments = call.id, call.function.name, call.function.arguments  # type: ignore[union-attr]
        assert (call_id, name, json.loads(arguments)) == ("toolu_fake", "weather",
                                                          {"city": "mesh"})
        asked += [{"role": "assistant", "content": None, "tool_calls": [
                      {"id": call_id, "type": "function",
                       "function": {"name": name, "arguments": arguments}}]},
                  {"role": "tool", "tool_call_id": call_id, "content": "18 degrees"}]
        answer = api.create(model="auto", messages=asked, tools=tools)
    assert answer.choices[0].message.content == "hello from claude"
    assert claude.seen[-1]["body"]["messages"][1:] == [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_fake",
                                           "name": "weather", "input": {"city": "mesh"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_fake",
                                      "content": "18 degrees"}]}]
    assert claude.seen[0]["body"]["tools"] == [{"name": "weather",
                                                "input_schema": WEATHER["input_schema"]}]


def test_a_chain_of_a_mesh_model_and_a_provider(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    node = FakeChat("n1", tokens=4)
    doc = providers_doc(fast, slow, chain=("qwen", "slowco/small-model"),
                        mesh={"qwen": {"tier": "large"}})
    with ServerThread(node.app()) as head, gateway(doc) as gw:
        httpx.post(f"{gw.url}/v1/nodes", json={
            "node_id": "n1", "model": "qwen", "start": 0, "end": 39, "layers": 40,
            "url": head.url, "tps": 10, "caps": ["vision"]}).raise_for_status()
        api = client(gw).messages
        mesh = api.with_raw_response.create(model="auto", max_tokens=8, messages=HI)
        api.create(model="auto", max_tokens=8, messages=[{"role": "user", "content": [
            {"type": "image", "source": {"type": "base64", "media_type": "image/gif",
                                         "data": "R0lGODlh"}}]}])
        node.status = 500
        over = api.with_raw_response.create(model="auto", max_tokens=8, messages=HI)
    assert mesh.headers["x-meshroute-route"] == "qwen|n1[0-39]"
    assert mesh.parse().content[0].text == "from n1"  # type: ignore[union-attr]
    assert node.seen[0]["body"]["messages"] == HI  # the mesh head got chat completions
    assert node.seen[1]["body"]["messages"][0]["content"] == [
        {"type": "image_url", "image_url": {"url": "data:image/gif;base64,R0lGODlh"}}]
    assert over.headers["x-meshroute-tried"] == "qwen,slowco/small-model#1"
    assert over.parse().content[0].text == "t0 t1 t2 t3 t4 t5 t6 t7"  # type: ignore[union-attr]
