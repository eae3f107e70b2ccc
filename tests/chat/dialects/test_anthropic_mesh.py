"""/v1/messages with the official anthropic client over mesh routes: emulated nodes
(node_agent.emulator) on loopback ports, the first route answering 500 (a fallback)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import anthropic
import httpx
import pytest

from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig
from node_agent.chat import words
from node_agent.emulator import EmulatedNode, EmulatorConfig

from ...upstream import ServerThread

MODEL = "emu-model"
HI = [{"role": "user", "content": "hi"}]
WEATHER = {"name": "weather", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def start(stack: ExitStack, nodes: dict[str, EmulatorConfig]) -> str:
    """A gateway with these emulated nodes registered (a node's `tps` is its prior): its URL."""
    gateway = build_gateway(ServeSettings(mdns=False, seed=3,
                                          router=RouterConfig(explore_share=0.0),
                                          first_byte_timeout_s=2.0, connect_timeout_s=1.0))
    url = stack.enter_context(ServerThread(gateway.app)).url
    for node_id, config in nodes.items():
        head = stack.enter_context(ServerThread(EmulatedNode(config).app()))
        httpx.post(f"{url}/v1/nodes", json={
            "node_id": node_id, "model": MODEL, "start": 0, "end": 31, "layers": 32,
            "url": head.url, "tps": config.tps,
            "caps": ["vision", "tools", "json_schema"]}).raise_for_status()
    return url


@pytest.fixture
def mesh() -> Iterator[anthropic.Anthropic]:
    """`bad` (believed the faster) fails every request with a 500; `ok` answers."""
    with ExitStack() as stack:
        url = start(stack, {"bad": EmulatorConfig(node_id="bad", fail_share=1.0, tps=500),
                            "ok": EmulatorConfig(node_id="ok", tps=200)})
        yield anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)


def test_a_message_after_a_fallback(mesh: anthropic.Anthropic) -> None:
    raw = mesh.messages.with_raw_response.create(model=MODEL, max_tokens=6, messages=HI)
    assert raw.headers["x-meshroute-mode"] == "fallback"
    assert raw.headers["x-meshroute-route"] == f"{MODEL}|ok[0-31]"
    msg = raw.parse()
    assert msg.model == MODEL and msg.id.startswith("msg_")
    assert msg.content[0].text == "".join(words(6))  # type: ignore[union-attr]
    assert msg.stop_reason == "max_tokens"  # the emulator stops at max_tokens
    assert msg.usage.output_tokens == 6 and msg.usage.input_tokens > 0


def test_a_stream_after_a_fallback(mesh: anthropic.Anthropic) -> None:
    with mesh.messages.stream(model=MODEL, max_tokens=6, messages=HI) as stream:
        kinds = [e.type for e in stream if e.type not in ("text", "input_json")]
        final = stream.get_final_message()
    assert kinds == ["message_start", "content_block_start", *["content_block_delta"] * 6,
                     "content_block_stop", "message_delta", "message_stop"]
    assert final.content[0].text == "".join(words(6))  # type: ignore[union-attr]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 6


@pytest.mark.parametrize("stream", [False, True])
def test_a_tool_use_round_trip(mesh: anthropic.Anthropic, stream: bool) -> None:
    asked: list[Any] = [{"role": "user", "content": "weather in Paris?"}]
    if stream:
        with mesh.messages.stream(model=MODEL, max_tokens=6, messages=asked,
                                  tools=[WEATHER]) as s:
            first = s.get_final_message()
    else:
        first = mesh.messages.create(model=MODEL, max_tokens=6, messages=asked, tools=[WEATHER])
    use = first.content[-1]
    assert first.stop_reason == "tool_use"
    assert use.type == "tool_use" and use.name == "weather" and use.input == {"city": "mesh"}
    asked += [{"role": "assistant", "content": [b.model_dump() for b in first.content]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                            "content": "18 degrees"}]}]
    answer = mesh.messages.create(model=MODEL, max_tokens=6, messages=asked, tools=[WEATHER])
    assert [b.type for b in answer.content] == ["text"]
    assert answer.content[0].text == "".join(words(6))  # type: ignore[union-attr]


def test_an_image_request_is_served(mesh: anthropic.Anthropic) -> None:
    msg = mesh.messages.create(model=MODEL, max_tokens=3, messages=[{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.test/cat.png"}},
        {"type": "text", "text": "what is it?"}]}])
    assert msg.content[0].type == "text" and msg.usage.output_tokens == 3


def test_count_tokens_and_errors(mesh: anthropic.Anthropic) -> None:
    assert mesh.messages.count_tokens(model=MODEL, messages=HI).input_tokens == 5  # 1 + 4
    with pytest.raises(anthropic.NotFoundError):
        mesh.messages.create(model="not-served", max_tokens=6, messages=HI)
    with pytest.raises(anthropic.BadRequestError) as bad:
        mesh.messages.create(model=MODEL, max_tokens=6, messages=[
            {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "w",
                                          "input": {}}]}])
    assert "a user message cannot hold a 'tool_use' block" in str(bad.value)


def test_a_stream_that_breaks_mid_way_ends_with_an_error_event() -> None:
    with ExitStack() as stack:
        url = start(stack, {"dies": EmulatorConfig(node_id="dies", die_share=1.0, tps=200)})
        client = anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0)
        texts: list[str] = []
        with (pytest.raises(anthropic.APIStatusError) as broken,
              client.messages.stream(model=MODEL, max_tokens=8, messages=HI) as stream):
            texts.extend(stream.text_stream)
    assert texts == list(words(8))[:4]  # the part before the node died, then the error
    assert broken.value.body["type"] == "error"  # type: ignore[index]
    assert broken.value.body["error"]["type"] == "api_error"  # type: ignore[index]


def test_refusals_before_the_chat_path_are_in_anthropic_shape(
        mesh: anthropic.Anthropic) -> None:
    url = str(mesh.base_url).rstrip("/")
    body = {"model": MODEL, "max_tokens": 2, "messages": HI}
    foreign = httpx.post(f"{url}/v1/messages", json=body, headers={"origin": "http://evil.test"})
    assert foreign.status_code == 403
    assert foreign.json()["type"] == "error"
    assert foreign.json()["error"]["type"] == "permission_error"
    wrong_method = httpx.get(f"{url}/v1/messages")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["type"] == "invalid_request_error"
    assert wrong_method.json()["type"] == "error"
    # like chat completions, any content type is taken (the Origin rule guards browsers)
    plain = httpx.post(f"{url}/v1/messages", content=json.dumps(body),
                       headers={"content-type": "text/plain"})
    assert plain.status_code == 200 and plain.json()["type"] == "message"
