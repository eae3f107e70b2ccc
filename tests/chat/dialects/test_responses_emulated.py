"""`responses.create` over emulated shard nodes (node_agent's emulator, whose plans really cross
their hops): the preferred head fails, the other two-hop route answers, streamed and not."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import openai
import pytest

from meshroute_middleware.app.config import GatewayConfig
from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig
from node_agent.chat import words
from node_agent.emulator import EmulatedNode, EmulatorConfig

from ...upstream import ServerThread

MODEL = "emu-model"
TWO_HOPS = "emu-model|head[0-15]->tail[16-31]"


@pytest.fixture
def gateway() -> Iterator[str]:
    nodes = [("broken", 0, 15, 400.0, {"fail_share": 1.0}),
             ("head", 0, 15, 200.0, {}), ("tail", 16, 31, 200.0, {})]
    with ExitStack() as stack:
        settings = ServeSettings(mdns=False, seed=3, router=RouterConfig(explore_share=0.0),
                                 first_byte_timeout_s=5.0, connect_timeout_s=1.0,
                                 state_file=":memory:")
        server = stack.enter_context(ServerThread(build_gateway(
            GatewayConfig.build(settings, {})).app))
        for node_id, start, end, tps, knobs in nodes:
            config = EmulatorConfig(node_id=node_id, model=MODEL, start=start, end=end,
                                    layers=32, tps=tps, **knobs)
            head = stack.enter_context(ServerThread(EmulatedNode(config).app()))
            joined = httpx.post(f"{server.url}/v1/nodes", json={
                "node_id": node_id, "model": MODEL, "start": start, "end": end,
                "layers": 32, "url": head.url, "tps": tps})
            assert joined.status_code in (200, 201), joined.text
        yield server.url


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)


def test_a_response_over_two_hops_after_a_failed_node(gateway: str) -> None:
    raw = _client(gateway).responses.with_raw_response.create(
        model=MODEL, input="hello there", max_output_tokens=6)
    response = raw.parse()
    assert raw.headers["x-meshroute-route"] == TWO_HOPS
    assert raw.headers["x-meshroute-mode"] == "fallback"
    assert response.output_text == "".join(words(6))
    assert response.status == "incomplete"  # the emulator stops at max_tokens: "length"
    assert response.usage is not None and response.usage.output_tokens == 6
    assert response.usage.input_tokens > 0


def test_a_streamed_response_over_two_hops(gateway: str) -> None:
    events: list[Any] = list(_client(gateway).responses.create(
        model=MODEL, input="hello there", max_output_tokens=8, stream=True))
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == "".join(words(8)) and len(deltas) == 8
    last = events[-1]
    assert last.type == "response.incomplete"
    assert last.response.output_text == "".join(words(8))
    assert last.response.usage is not None and last.response.usage.output_tokens == 8
