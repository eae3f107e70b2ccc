"""The emulated shard node on real uvicorn: speed, queueing, OpenAI format, plans, faults."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import aiohttp
import anyio
import openai
import pytest

from node_agent.chat import words
from node_agent.emulator import EmulatedNode, EmulatorConfig, serve_node
from node_agent.shard import ShardWorker

pytestmark = pytest.mark.anyio

MODEL = "emu-model"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "hello there"}]}


def _cfg(node_id: str, start: int, end: int, **knobs: Any) -> EmulatorConfig:
    return EmulatorConfig(node_id=node_id, model=MODEL, start=start, end=end, layers=32,
                          **knobs)


@asynccontextmanager
async def _mesh(*configs: EmulatorConfig) -> AsyncIterator[list[tuple[EmulatedNode, str]]]:
    async with AsyncExitStack() as stack:
        yield [await stack.enter_async_context(serve_node(c)) for c in configs]


def _plan(*hops: tuple[EmulatedNode, str, int, int]) -> dict[str, str]:
    plan = [{"node_id": n.config.node_id, "url": u, "start_layer": s, "end_layer": e}
            for n, u, s, e in hops]
    return {"x-meshroute-plan": json.dumps(plan)}


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, Any],
                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with session.post(url + "/v1/chat/completions", json=body,
                            headers=headers or {}) as resp:
        return resp.status, await resp.read()


async def test_two_hop_tokens_per_s_match_configured_speeds() -> None:
    # head: 16 layers x 1 ms; tail: 16 layers x 0.5 ms + 2 ms link -> 26 ms/token, 38.5 tok/s.
    # Hops must not pipeline a request's tokens: max-of-hops would give 55.6 tok/s.
    head = _cfg("head", 0, 15, seconds_per_layer=0.001)
    tail = _cfg("tail", 16, 31, seconds_per_layer=0.0005, hop_latency_s=0.002)
    expected_tps = 1 / (16 * 0.001 + 16 * 0.0005 + 0.002)
    async with _mesh(head, tail) as [(a, ua), (b, ub)], aiohttp.ClientSession() as s:
        headers = _plan((a, ua, 0, 15), (b, ub, 16, 31))
        began = time.perf_counter()
        status, body = await _post(s, ua, {**CHAT, "max_tokens": 24, "stream": True}, headers)
        elapsed_s = time.perf_counter() - began
    assert status == 200 and body.endswith(b"data: [DONE]\n\n")
    measured_tps = 24 / elapsed_s
    # Never faster than the configured speeds (pipelined hops would give 55.6 tok/s, 1.44x);
    # a busy machine only makes sleeps longer, so the bound below is loose: on an idle one the
    # figure lands within 10 % (issue 4), under stress-ng on both cores it fell 15 % short.
    assert expected_tps / 3 < measured_tps <= expected_tps * 1.10
    assert (b.worker.tokens_total, b.worker.requests_total) == (24, 1)  # really crossed the tail
    assert 1 / (16 * 0.001) / 3 < a.measured_tps <= 1 / (16 * 0.001) * 1.10


async def test_requests_beyond_slots_queue() -> None:
    # 6 requests of 10 tokens x 10 ms on 2 slots: three waves of at least 100 ms each. A busy
    # machine only makes a wave later, so the waves are checked from below: without the slot
    # limit every request would take ~100 ms and the later waves would fail.
    node = _cfg("solo", 0, 31, seconds_per_layer=0.01 / 32, slots=2)
    latencies: list[float] = []
    depths: list[int] = []
    async with _mesh(node) as [(_, url)], aiohttp.ClientSession() as s:
        async def one() -> None:
            began = time.perf_counter()
            status, _ = await _post(s, url, {**CHAT, "max_tokens": 10})
            assert status == 200
            latencies.append(time.perf_counter() - began)

        async with anyio.create_task_group() as tg:
            for _ in range(6):
                tg.start_soon(one)
            while len(latencies) < 2:  # poll the queue while the first wave runs
                async with s.get(url + "/internal/status") as resp:
                    depths.append((await resp.json())["queue"])
                await anyio.sleep(0.01)
    latencies.sort()
    assert max(depths) == 4  # two serving, four waiting
    for wave, pair in enumerate((latencies[0:2], latencies[2:4], latencies[4:6]), start=1):
        for latency in pair:  # 10 ms of slack for the timer's own rounding
            assert latency > 0.1 * wave - 0.01, latencies


async def test_a_full_batch_runs_each_request_slower() -> None:
    # 4 slots, 50 % per neighbour: 4 requests of 20 tokens x 10 ms run together at 2.5x,
    # ~500 ms each; alone one takes ~200 ms. A serial server (each waits for the others)
    # would give 100/200/300/400 ms, free batching 100 ms for all.
    node = _cfg("batch", 0, 31, seconds_per_layer=0.01 / 32, slots=4, slot_slowdown=0.5)
    latencies: list[float] = []
    async with _mesh(node) as [(_, url)], aiohttp.ClientSession() as s:
        async def one() -> None:
            began = time.perf_counter()
            status, _ = await _post(s, url, {**CHAT, "max_tokens": 20})
            assert status == 200
            latencies.append(time.perf_counter() - began)

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(one)
        await one()
    together, alone = sorted(latencies[:4]), latencies[4]
    # Ratios, not wall-clock bounds (a loaded machine stretches every sleep): together each
    # takes ~2.5x as long as alone (>= 1.6x allows for the first tokens running before the
    # batch is full and ~50 ms of HTTP per request on a loaded machine; free batching gives
    # 1x), and they end together (a serial queue would give 1:2:3:4).
    assert together[0] >= 1.6 * alone, (together, alone)
    assert together[-1] <= 1.3 * together[0], together


def test_the_batch_slowdown_grows_with_the_requests_running() -> None:
    worker = ShardWorker(_cfg("w", 0, 31, slot_slowdown=0.25))
    assert worker.slowdown() == 1.0
    worker.running = 3
    assert worker.slowdown() == pytest.approx(1.5)


async def test_a_request_holds_a_slot_on_every_hop() -> None:
    # The tail has one slot: two concurrent two-hop requests run one after the other.
    head = _cfg("head", 0, 15, seconds_per_layer=0.01 / 16, slots=4)
    tail = _cfg("tail", 16, 31, seconds_per_layer=0.0, slots=1)
    async with _mesh(head, tail) as [(a, ua), (b, ub)], aiohttp.ClientSession() as s:
        headers = _plan((a, ua, 0, 15), (b, ub, 16, 31))
        began = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for _ in range(2):
                tg.start_soon(_post, s, ua, {**CHAT, "max_tokens": 10}, headers)
        elapsed_s = time.perf_counter() - began
    # 2 x 100 ms serialised; ~100 ms if the tail did not queue (a busy machine is only slower)
    assert elapsed_s > 0.18


async def test_openai_client_parses_stream_and_usage() -> None:
    async with _mesh(_cfg("solo", 0, 31, seconds_per_layer=0.0)) as [(_, url)]:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=7,
            stream=True, stream_options={"include_usage": True})
        parts, usage = [], None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage = chunk.usage
        full = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}])
        models = await client.models.list()
        await client.close()
    assert "".join(parts) == "".join(words(7))
    assert usage is not None and usage.completion_tokens == 7
    assert full.choices[0].message.content == "".join(words(16))  # max_tokens_default
    assert full.usage is not None and full.usage.completion_tokens == 16
    assert full.choices[0].finish_reason == "stop"
    assert [m.id for m in models.data] == [MODEL]


async def test_sse_wire_format() -> None:
    async with _mesh(_cfg("solo", 0, 31, seconds_per_layer=0.0)) as [(_, url)], \
            aiohttp.ClientSession() as s:
        status, body = await _post(s, url, {**CHAT, "max_tokens": 3, "stream": True})
    events = body.split(b"\n\n")
    assert status == 200 and events[-1] == b"" and events[-2] == b"data: [DONE]"
    payloads = [json.loads(e.removeprefix(b"data: ")) for e in events[:-2]]
    assert all(e.startswith(b"data: ") for e in events[:-1])
    assert [p["choices"][0]["delta"].get("content") for p in payloads] == [
        *words(3), None]
    assert payloads[-1]["choices"][0]["finish_reason"] == "length"
    assert "usage" not in payloads[0]  # only with stream_options.include_usage


ERRORS = [
    ("no plan on a partial shard", _cfg("part", 0, 15), {}, CHAT, 400, "x-meshroute-plan"),
    ("unknown model", _cfg("solo", 0, 31), {}, {**CHAT, "model": "other"}, 404, "other"),
    ("bad max_tokens", _cfg("solo", 0, 31), {}, {**CHAT, "max_tokens": -1}, 400, "max_tokens"),
    ("no messages", _cfg("solo", 0, 31), {}, {"model": MODEL}, 400, "messages"),
    ("plan not json", _cfg("solo", 0, 31), {"x-meshroute-plan": "[{"}, CHAT, 400, "JSON"),
    ("plan for another node", _cfg("solo", 0, 31),
     {"x-meshroute-plan": json.dumps([{"node_id": "x", "url": "http://127.0.0.1:1",
                                       "start_layer": 0, "end_layer": 31}])}, CHAT, 400, "'x'"),
    ("injected failure", _cfg("solo", 0, 31, fail_share=1.0), {}, CHAT, 500, "fault"),
    ("died before answering", _cfg("solo", 0, 31, die_share=1.0), {}, CHAT, 500, "died"),
]


@pytest.mark.parametrize(("case", "config", "headers", "body", "status", "needle"), ERRORS,
                         ids=[e[0] for e in ERRORS])
async def test_errors_are_openai_style(case: str, config: EmulatorConfig,
                                       headers: dict[str, str], body: dict[str, Any],
                                       status: int, needle: str) -> None:
    async with _mesh(config) as [(_, url)], aiohttp.ClientSession() as s:
        got_status, raw = await _post(s, url, body, headers)
    error = json.loads(raw)["error"]
    assert got_status == status and needle in error["message"] and error["type"]


async def test_failing_downstream_hop_fails_the_head_before_first_byte() -> None:
    head, tail = _cfg("head", 0, 15), _cfg("tail", 16, 31, fail_share=1.0)
    async with _mesh(head, tail) as [(a, ua), (b, ub)], aiohttp.ClientSession() as s:
        status, raw = await _post(s, ua, CHAT, _plan((a, ua, 0, 15), (b, ub, 16, 31)))
        assert (a.worker.running, b.worker.running) == (0, 0)
    assert status == 502 and "tail" in json.loads(raw)["error"]["message"]


async def test_die_mid_stream_drops_the_connection() -> None:
    head, tail = _cfg("head", 0, 15), _cfg("tail", 16, 31, die_share=1.0)
    async with _mesh(head, tail) as [(a, ua), (b, ub)], aiohttp.ClientSession() as s:
        body = {**CHAT, "max_tokens": 8, "stream": True}
        async with s.post(ua + "/v1/chat/completions", json=body,
                          headers=_plan((a, ua, 0, 15), (b, ub, 16, 31))) as resp:
            assert resp.status == 200
            with pytest.raises(aiohttp.ClientPayloadError):
                await resp.read()
        await anyio.sleep(0.05)
        assert (a.worker.running, b.worker.running) == (0, 0)  # slots released


async def test_stall_holds_the_first_token() -> None:
    config = _cfg("solo", 0, 31, stall_share=1.0, stall_s=5.0)
    async with _mesh(config) as [(n, url)], aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", json={**CHAT, "stream": True}) as resp:
            assert resp.status == 200  # a stream's headers leave at once, like vLLM's
            with pytest.raises(TimeoutError), anyio.fail_after(0.3):
                await resp.content.readany()
        with pytest.raises(TimeoutError), anyio.fail_after(0.3):
            await _post(s, url, CHAT)  # not streamed: not even a status line
        await anyio.sleep(0.05)
        assert n.worker.running == 0  # the clients' disconnects freed both slots


def test_noise_is_seeded_and_mean_one() -> None:
    # 4000 draws, sigma 0.3: standard error of the mean 0.0048; tolerance 0.02 (> 4 s.e.).
    config = EmulatorConfig(noise_sigma=0.3, seed=7)
    draws = [ShardWorker(config).noise() for _ in range(3)]
    assert draws[0] == draws[1] == draws[2]
    worker = ShardWorker(config)
    many = [worker.noise() for _ in range(4000)]
    assert statistics.fmean(many) == pytest.approx(1.0, abs=0.02)
    assert statistics.stdev(many) > 0.2


def test_fault_shares_are_honoured() -> None:
    # 3000 draws: each share's standard error is <= 0.009; tolerance 0.04.
    worker = ShardWorker(EmulatorConfig(fail_share=0.2, die_share=0.1, stall_share=0.1))
    faults = [worker.fault() for _ in range(3000)]
    for name, share in (("fail", 0.2), ("die", 0.1), ("stall", 0.1), (None, 0.6)):
        assert faults.count(name) / 3000 == pytest.approx(share, abs=0.04)
