"""Provider keys' first-byte deadlines, learned per key and per load (issue 34).

Taken out once because under a burst a 1 s floor turned a provider's 429 into a 502: the
burst's answers came later than a deadline learned while the key was idle. Now a deadline
holds only under a load it was learned under, so a hung key costs ~its normal worst case and
a burst keeps the ceiling: the provider's own answer reaches the client. On a virtual clock
(tests/chat/virtual_time.py): no wall-clock bound."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field, replace

import httpx
import pytest

from meshroute_middleware.app.config import GatewayConfig
from meshroute_middleware.app.gateway import Gateway, build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.chat.deadlines import (
    FLOOR_S,
    MARGIN,
    MIN_SAMPLES,
    KeyDeadlines,
    LearnedCut,
)
from meshroute_middleware.core import RouterConfig
from meshroute_middleware.core.providers.config import parse_providers_config
from meshroute_middleware.forwarding.client import ForwardError

from .virtual_time import run_virtual

ENV = {"KEY_A": "sk-a-secret", "KEY_B": "sk-b-secret"}
ANSWER = json.dumps({"id": "x", "object": "chat.completion", "model": "big", "choices": [
    {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}}).encode()


@dataclass
class _Head:
    status: int
    body: bytes
    headers: list[tuple[bytes, bytes]] = field(
        default_factory=lambda: [(b"content-type", b"application/json")])

    async def chunks(self) -> AsyncIterator[bytes]:
        yield self.body

    def close(self) -> None:
        pass


@dataclass
class Provider:
    """A provider's heads: each answer after `head_s`; `limited` answers 429 instead."""

    head_s: float = 0.02
    limited: bool = False
    hang: bool = False
    slow: frozenset[int] = frozenset()  # these requests (1 is the first) answer after 2 s
    opened: int = 0
    cut: int = 0

    async def open(self, url: str, body: bytes,
                   headers: Iterable[tuple[bytes, bytes]]) -> _Head:
        self.opened += 1
        try:
            await asyncio.sleep(3600 if self.hang else 2.0 if self.opened in self.slow
                                else self.head_s)
        except asyncio.CancelledError:
            self.cut += 1
            raise
        if self.limited:
            raise ForwardError("http_429", "slow down", 429, retry_after="5")
        return _Head(200, ANSWER)

    async def aclose(self) -> None:
        pass


def _gateway(provider: Provider, chain: tuple[str, ...] = ("fastco/big",),
             **settings: object) -> Gateway:
    doc = {"routing": {"chain": list(chain), "strategy": "priority"},
           "providers": [{"name": "fastco", "base_url": "http://127.0.0.1:9/v1",
                          "keys": ["env:KEY_A"],
                          "models": [{"id": "big", "tier": "large", "context": 4096},
                                     {"id": "other", "tier": "large", "context": 4096},
                                     {"id": "third", "tier": "large", "context": 4096}]}]}
    base = replace(ServeSettings(), mdns=False, seed=3, state_file=":memory:",
                   router=RouterConfig(explore_share=0.0),
                   providers=parse_providers_config(doc))  # first-byte timeout: 60 s
    return build_gateway(GatewayConfig.build(replace(base, **settings), ENV),
                         forwarder=provider)


async def _post(client: httpx.AsyncClient) -> tuple[int, float]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    answer = await client.post("/v1/chat/completions", json={
        "model": "auto", "messages": [{"role": "user", "content": "hi"}]})
    return answer.status_code, loop.time() - started


def _client(gateway: Gateway) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app),
                             base_url="http://gw", timeout=600)


def test_a_burst_meets_no_deadline_learned_while_idle_and_gets_the_providers_429() -> None:
    provider = Provider()
    gateway = _gateway(provider)

    async def main() -> list[tuple[int, float]]:
        async with _client(gateway) as client:
            for _ in range(MIN_SAMPLES + 2):  # learned one at a time: 20 ms, at load 1
                assert (await _post(client))[0] == 200
            provider.head_s, provider.limited = 1.5, True  # a burst: 429s, late
            return list(await asyncio.gather(*(_post(client) for _ in range(50))))

    answers = run_virtual(main)
    assert [status for status, _ in answers] == [429] * 50  # not one 502
    assert provider.cut == 0


def test_a_key_that_hangs_once_is_cut_at_its_learned_deadline_and_the_next_route_answers(
        ) -> None:
    provider = Provider()
    gateway = _gateway(provider, ("fastco/big", "fastco/other"))

    async def main() -> tuple[int, float]:
        async with _client(gateway) as client:
            for _ in range(MIN_SAMPLES + 2):  # the first route's key warm: 20 ms, at load 1
                assert (await _post(client))[0] == 200
            provider.hang = True
            first = asyncio.ensure_future(_post(client))
            await asyncio.sleep(0.5)
            provider.hang = False  # the next route's head comes in 20 ms
            return await first

    status, took = run_virtual(main)
    assert status == 200
    assert FLOOR_S <= took < FLOOR_S + 0.5, took  # the floor, then the next key: not 60 s
    assert provider.cut == 1


def test_the_deadline_is_learned_per_load_and_never_under_the_worst_seen() -> None:
    deadlines = KeyDeadlines()
    for _ in range(MIN_SAMPLES - 1):
        deadlines.observe("k#1", 0.02, 1)
    assert deadlines.deadline_s("k#1", 1) is None  # cold
    deadlines.observe("k#1", 0.9, 1)  # one slow answer among fast ones
    assert deadlines.deadline_s("k#1", 1) == pytest.approx(MARGIN * 0.9)
    assert deadlines.deadline_s("k#1", 2) is None  # never seen under 2 in flight
    for _ in range(MIN_SAMPLES):
        deadlines.observe("k#1", 0.5, 8)
    assert deadlines.deadline_s("k#1", 4) == pytest.approx(MARGIN * 0.5)
    assert deadlines.deadline_s("k#1", 1) == pytest.approx(MARGIN * 0.9)


def test_a_cut_is_a_learned_cut_and_the_key_forgets() -> None:
    deadlines = KeyDeadlines()
    for _ in range(MIN_SAMPLES):
        deadlines.observe("k#1", 0.02, 1)

    async def main() -> None:
        with pytest.raises(LearnedCut):
            await deadlines.open("k#1", asyncio.sleep(30), 60.0)

    run_virtual(main)
    assert deadlines.deadline_s("k#1", 1) is None
