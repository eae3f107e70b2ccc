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
        result = await B.conv_load([B.Gatewayed(url), B.Gatewayed(url)], 1.5)
    assert result["failures"] == 0 and result["turns"] >= 4
    assert result["warm_share_later_turns"] == 1.0
    assert result["mean_ttft_s"] > 0


def test_the_oracle_keeps_a_conversation_warm_and_spreads_new_ones() -> None:
    oracle = B.Oracle(["a", "b", "c"], [1000.0, 1000.0, 200.0])
    first = [oracle.pick(1000, None) for _ in range(2)]
    assert first == ["a", "b"]  # equal speeds: the least busy; never the slow one cold
    assert oracle.pick(1000, None) == "a"  # c cold costs 5x: a queues one more instead
    oracle.done("b")
    assert oracle.pick(1100, ("b", 1050)) == "b"  # warm where it lives
    # warm on the slow node: 50 uncached tokens at 200/s beat 1,100 cold at 1,000/s
    assert oracle.pick(1100, ("c", 1050)) == "c"
