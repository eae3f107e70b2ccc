"""Smoke test of bench_realtime's conversation harness against an in-process emulated node
with a prefix cache: turns carry the history, so every later turn is warm there."""

from __future__ import annotations

import pytest

from benchmarks import bench_realtime as B
from node_agent.emulator import EmulatorConfig, serve_node

pytestmark = pytest.mark.anyio


async def test_the_conversation_clients_find_their_prefix_warm_on_their_node() -> None:
    cfg = EmulatorConfig(node_id="a", model=B.MODEL, start=0, end=31, layers=32, tps=2000.0,
                         slots=4, prefill_tps=1_000_000.0, cache_tokens=100_000)
    async with serve_node(cfg) as (_, url):
        result = await B.conv_load([url, url], 1.5)
    assert result["failures"] == 0 and result["turns"] >= 4
    assert result["warm_share_later_turns"] == 1.0
    assert result["mean_ttft_s"] > 0
