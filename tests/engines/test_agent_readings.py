"""The node agent's reader against a live llama.cpp server (issue 31): after a `max_tokens: 1`
answer, while idle and after a restart the announced speed stays within 2x of the decode
speed the server measured for its answers (`timings.predicted_per_second`), and it claims no
cache figure the server did not give. The pages are those of fixtures in
tests/node_agent/fixtures/llamacpp_real, read live."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import pytest

from meshroute_middleware.core.cache_prior import CachePrior
from node_agent.load import LoadReader

from .llama_server import LlamaServer

CONFIGURED_TPS = 10.0  # `meshroute node --tps`: announced until a speed window closes
CONTEXT = 4096  # tokens per slot: LlamaServer's --ctx-size is per slot times --parallel
FOX = " ".join(f"The quick brown fox jumps over the lazy dog number {i}." for i in range(40))


async def ask(url: str, messages: list[dict[str, str]], max_tokens: int) -> dict[str, Any]:
    """One chat answer of exactly `max_tokens` tokens; the server's timings of it."""
    body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True}
    async with httpx.AsyncClient(timeout=180) as client:
        resp = await client.post(url + "/v1/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    timings: dict[str, Any] = resp.json()["timings"]
    assert timings["predicted_n"] == max_tokens
    return timings


def within_2x(announced: float, measured: float) -> bool:
    return measured / 2 <= announced <= measured * 2


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[LlamaServer]:
    running = LlamaServer(tmp_path / "llama-server.log", parallel=2, ctx_size=CONTEXT).start()
    try:
        yield running
    finally:
        running.stop()


# alone (.ci/run's alone group): it compares the announced speed with the real server's
# decode speed at two moments, which a loaded parallel run moves apart (52 then 123 tok/s in
# one run, 2026-12-07: the neighbours' load, not the reading)
@pytest.mark.alone
@pytest.mark.anyio
async def test_the_agent_reads_a_live_llama_server_right(server: LlamaServer) -> None:
    reader = LoadReader(server.url + "/v1", "auto", CONFIGURED_TPS)
    async with aiohttp.ClientSession() as session:
        await reader.read_once(session)
        assert reader.source == "llamacpp" and reader.slot_count() == 2
        assert reader.cache_prior() == CachePrior(None, CONTEXT)  # /props n_ctx per slot

        # one `max_tokens: 1` answer: 1 token in 1 µs on /metrics
        await ask(server.url, [{"role": "user", "content": "Say hi."}], 1)
        await reader.read_once(session)
        assert reader.announcement() == (0, CONFIGURED_TPS)
        # /slots now says its last prompt had 0 of ~33 tokens cached: no claim from it
        assert reader.cache_prior() == CachePrior(None, CONTEXT)

        fox = [{"role": "system", "content": FOX},
               {"role": "user", "content": "Write a short story about a fox."}]
        # 160 tokens: over the window's 1 s of decoding (node_agent/windows.py) even on a quiet
        # machine (~64 tok/s here: 64 tokens took 1.0 s, announced nothing)
        first = await ask(server.url, fox, 160)
        await reader.read_once(session)
        _, tps = reader.announcement()
        print(f"after a 160-token answer: announced {tps:.1f} tok/s, measured "
              f"{first['predicted_per_second']:.1f}")
        assert within_2x(tps, first["predicted_per_second"])
        assert reader.cache_prior() == CachePrior(None, CONTEXT)  # cold prompts only

        # a `max_tokens: 1` answer after real ones, then idle reads: the figure stays
        await ask(server.url, [{"role": "user", "content": "Say bye."}], 1)
        for _ in range(3):
            await reader.read_once(session)
            assert reader.announcement()[1] == tps

        # the conversation returns: its prefix is reused, and the counters say so
        returning = [*fox, {"role": "assistant", "content": "Once upon a time."},
                     {"role": "user", "content": "Go on."}]
        warm = await ask(server.url, returning, 32)
        assert warm["cache_n"] > 500
        await reader.read_once(session)
        prior = reader.cache_prior()
        assert prior is not None and prior.cached_tokens == CONTEXT
        assert prior.hit_rate is not None and prior.hit_rate > 0.5
        before_restart = reader.announcement()[1]

        server.stop()
        await reader.read_once(session)  # down: nothing read, nothing changes
        assert reader.announcement()[1] == before_restart
        server.start()
        after = await ask(server.url, [{"role": "user", "content": "Name three colours."}], 16)
        await reader.read_once(session)
        _, tps = reader.announcement()
        print(f"after a restart: announced {tps:.1f} tok/s, measured "
              f"{after['predicted_per_second']:.1f}")
        assert reader.speed.restarts == 1 and tps == before_restart
        assert within_2x(tps, after["predicted_per_second"])
        assert reader.cache_prior() == CachePrior(None, CONTEXT)  # a new, empty cache
