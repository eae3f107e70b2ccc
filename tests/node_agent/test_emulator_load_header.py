"""The emulated node tells on every answer how many requests it holds (x-meshroute-load,
issue 31), and the gateway's forward path hands that count to its router."""

from __future__ import annotations

import aiohttp
import pytest

from meshroute_middleware.chat.forward import note_node_load
from meshroute_middleware.core import NodeRecord, Router, RouterConfig
from meshroute_middleware.core.contracts.load import LOAD_HEADER, parse_held
from node_agent.emulator import EmulatorConfig, serve_node

from ..conftest import FakeClock


@pytest.mark.anyio
async def test_each_answer_carries_the_requests_the_node_holds() -> None:
    # 2 slots; a long streamed answer holds one while a second request starts beside it.
    cfg = EmulatorConfig(node_id="n", model="m", start=0, end=31, layers=32,
                         seconds_per_layer=0.001, slots=2)  # 32 ms a token
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 200, "stream": True}  # ~6 s: far longer than the second's start
    short = {**body, "max_tokens": 2}
    async with (serve_node(cfg) as (_, url), aiohttp.ClientSession() as session,
                session.post(url + "/v1/chat/completions", json=body) as first):
        assert first.status == 200
        async with session.post(url + "/v1/chat/completions", json=short) as second:
            assert second.status == 200
            await second.read()
        first.release()
    assert parse_held(first.headers.get(LOAD_HEADER)) == 1  # itself
    assert parse_held(second.headers.get(LOAD_HEADER)) == 2  # itself and the first


def test_the_forward_path_hands_the_heads_count_to_the_router() -> None:
    clock = FakeClock()
    router = Router(RouterConfig(), clock=clock)
    router.upsert_node(NodeRecord("gpu", "m", 0, 31, 32, "http://gpu.test", 100.0, slots=2))
    decision = router.choose("m")
    note_node_load(router, decision, [(b"Content-Type", b"text/event-stream"),
                                      (b"X-Meshroute-Load", b"3")])
    assert router.arms("m")[0].in_flight == 3  # ours and the two another tracker sent
    note_node_load(router, decision, [(LOAD_HEADER.encode(), b"junk")])
    assert router.arms("m")[0].in_flight == 3  # a malformed value says nothing
