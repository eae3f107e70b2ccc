"""Issue 26: the emulated node's prefix cache and prefill (`meshroute node --emulate
--prefill-tps --cache-tokens`), each hop of a chain with its own cache."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import pytest

from meshroute_middleware.core.prefix import message_chain
from node_agent.chat import words
from node_agent.cli import emulator_config, node_settings
from node_agent.emulator import EmulatedNode, EmulatorConfig, serve_node
from node_agent.hops import PROMPT_ENTRIES, decode_prompt, encode_prompt
from node_agent.shard import ShardWorker

MODEL = "emu-model"
SYSTEM = {"role": "system", "content": "x" * 8000}  # ~2,000 tokens (4 characters each)


def _cfg(node_id: str, start: int = 0, end: int = 31, **knobs: Any) -> EmulatorConfig:
    return EmulatorConfig(node_id=node_id, model=MODEL, start=start, end=end, layers=32,
                          seconds_per_layer=0.0001, **knobs)


# -- pure --------------------------------------------------------------------------------
def test_a_warm_prompt_prefills_only_its_new_part() -> None:
    worker = ShardWorker(_cfg("n", prefill_tps=1000.0, cache_tokens=100_000,
                              first_token_s=0.05))
    turn1 = message_chain([SYSTEM, {"role": "user", "content": "hi"}])
    assert turn1 is not None
    cold = worker.prefill_s(turn1, 32)
    assert cold == pytest.approx(0.05 + turn1.prompt_tokens / 1000.0)
    answer = "".join(words(16))
    worker.remember(turn1, answer)
    turn2 = message_chain([SYSTEM, {"role": "user", "content": "hi"},
                           {"role": "assistant", "content": answer},
                           {"role": "user", "content": "and then?"}])
    assert turn2 is not None
    warm = worker.prefill_s(turn2, 32)
    new_tokens = turn2.prompt_tokens - turn2.tokens[2]
    assert warm == pytest.approx(0.05 + new_tokens / 1000.0)
    assert worker.cached_tokens_total == turn2.tokens[2]


def test_a_hop_prefills_its_share_of_the_layers_and_no_cache_means_cold() -> None:
    worker = ShardWorker(_cfg("n", 0, 15, prefill_tps=1000.0))
    prompt = message_chain([SYSTEM])
    assert prompt is not None
    assert worker.prefill_s(prompt, 16) == pytest.approx(prompt.prompt_tokens / 2000.0)
    assert worker.prefill_s(prompt, 16) == pytest.approx(prompt.prompt_tokens / 2000.0)


def test_without_the_knobs_prompts_cost_nothing_as_before() -> None:
    worker = ShardWorker(_cfg("n"))
    assert worker.cache is None
    assert worker.prefill_s(message_chain([SYSTEM]), 32) == 0.0


def test_the_prompt_header_round_trips_and_rejects_junk() -> None:
    prompt = message_chain([{"role": "user", "content": str(k)} for k in range(100)])
    assert prompt is not None
    back = decode_prompt(encode_prompt(prompt))
    assert back is not None
    assert back.hashes == prompt.hashes[-PROMPT_ENTRIES:]
    assert back.tokens == prompt.tokens[-PROMPT_ENTRIES:]
    for junk in ("", "zz:1", "1:2:3", "1:-5", "1:5,2:3", "1" * 17 + ":1",
                 ",".join(["1:1"] * (PROMPT_ENTRIES + 1))):
        assert decode_prompt(junk) is None


def test_the_node_command_takes_the_cache_knobs() -> None:
    s = node_settings({"emulate": True, "prefill_tps": 1000.0, "cache_tokens": 64000,
                       "first_token_s": 0.02}, {})
    cfg = emulator_config(s)
    assert (cfg.prefill_tps, cfg.cache_tokens, cfg.first_token_s) == (1000.0, 64000, 0.02)
    assert ShardWorker(cfg).cache is not None


# -- on real uvicorn (loopback) ---------------------------------------------------------
@asynccontextmanager
async def _mesh(*configs: EmulatorConfig) -> AsyncIterator[list[tuple[EmulatedNode, str]]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(serve_node(c)) for c in configs]


async def _first_token_s(session: aiohttp.ClientSession, url: str, messages: list[Any],
                         headers: dict[str, str] | None = None) -> tuple[float, str]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 8, "stream": True}
    began = time.perf_counter()
    first = None
    text = ""
    async with session.post(url + "/v1/chat/completions", json=body,
                            headers=headers or {}) as resp:
        assert resp.status == 200
        async for line in resp.content:
            if line.startswith(b"data: {"):
                delta = json.loads(line[6:])["choices"]
                if delta and "content" in delta[0]["delta"]:
                    first = first or time.perf_counter() - began
                    text += delta[0]["delta"]["content"]
    assert first is not None
    return first, text


@pytest.mark.anyio
async def test_the_returning_turn_skips_its_prefill_on_the_node_that_served_it() -> None:
    # ~2,000 prompt tokens at 2,000 tok/s: a cold first token waits >= 1 s (a sleep is never
    # shorter); the warm turn prefills ~10 new tokens. A loaded machine only lengthens both.
    config = _cfg("n", prefill_tps=2000.0, cache_tokens=100_000)
    async with _mesh(config) as [(node, url)], aiohttp.ClientSession() as s:
        turn1 = [SYSTEM, {"role": "user", "content": "hi"}]
        cold, answer = await _first_token_s(s, url, turn1)
        turn2 = [*turn1, {"role": "assistant", "content": answer},
                 {"role": "user", "content": "go on"}]
        warm, _ = await _first_token_s(s, url, turn2)
    assert cold >= 1.0
    assert warm < cold / 2
    assert node.worker.cached_tokens_total > 2000


@pytest.mark.anyio
async def test_each_hop_of_a_chain_keeps_its_own_cache() -> None:
    # The head keeps no cache, the tail does: on the second turn only the tail finds it.
    head = _cfg("head", 0, 15, prefill_tps=20000.0)
    tail = _cfg("tail", 16, 31, prefill_tps=20000.0, cache_tokens=100_000)
    async with _mesh(head, tail) as [(a, ua), (b, ub)], aiohttp.ClientSession() as s:
        plan = [{"node_id": "head", "url": ua, "start_layer": 0, "end_layer": 15},
                {"node_id": "tail", "url": ub, "start_layer": 16, "end_layer": 31}]
        headers = {"x-meshroute-plan": json.dumps(plan)}
        turn1 = [SYSTEM, {"role": "user", "content": "hi"}]
        _, answer = await _first_token_s(s, ua, turn1, headers)
        turn2 = [*turn1, {"role": "assistant", "content": answer},
                 {"role": "user", "content": "go on"}]
        await _first_token_s(s, ua, turn2, headers)
    assert a.worker.cached_tokens_total == 0
    assert b.worker.cached_tokens_total > 2000
    assert b.worker.prefilled_tokens_total < a.worker.prefilled_tokens_total
