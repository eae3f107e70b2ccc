"""The gap between two chunks learned per route (issue 34): a route whose chunks come 10 ms
apart and then falls silent mid-answer is cut at its learned gap (at least
chat.deadlines.FLOOR_S), not at the idle timeout (30 s). On a virtual clock
(tests/chat/virtual_time.py): no wall-clock bound."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field, replace

import httpx
import pytest

from meshroute_middleware.app.gateway import Gateway, build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.chat.deadlines import FLOOR_S, MARGIN, MIN_SAMPLES, GapDeadlines
from meshroute_middleware.core import RouterConfig
from meshroute_middleware.forwarding.client import ForwardError

from ..conftest import FakeClock
from .test_hedge import CHAT, SSE, node
from .virtual_time import run_virtual

IDLE_S = 30.0  # the forwarder's idle timeout (the default)


@dataclass
class _Stream:
    """As the real forwarders' responses: silent past `idle_s` mid-answer, it breaks off."""

    owner: Stalling
    stall: bool
    status: int = 200
    headers: list[tuple[bytes, bytes]] = field(default_factory=lambda: list(SSE))
    idle_s: float = IDLE_S

    async def chunks(self) -> AsyncIterator[bytes]:
        for i in range(6):
            if i:
                silence = 2 * IDLE_S if self.stall and i == 3 else self.owner.gap_s
                await asyncio.sleep(min(silence, self.idle_s))
                if silence > self.idle_s:
                    raise ForwardError("stream", "the head stalled mid-response")
            yield b'data: {"choices":[{"delta":{"content":"w' + str(i).encode() + b'"}}]}\n\n'
        yield b"data: [DONE]\n\n"

    def close(self) -> None:
        self.owner.closed += 1


@dataclass
class Stalling:
    """A head streaming 6 chunks `gap_s` apart, but falling silent for the idle timeout
    after its 3rd chunk on the requests numbered in `stalls`."""

    gap_s: float = 0.01
    stalls: set[int] = field(default_factory=set)
    opened: int = 0
    closed: int = 0
    idle_s: float = IDLE_S

    async def open(self, url: str, body: bytes,
                   headers: Iterable[tuple[bytes, bytes]]) -> _Stream:
        self.opened += 1
        return _Stream(self, self.opened in self.stalls)

    async def aclose(self) -> None:
        pass


def _gateway(upstream: Stalling) -> Gateway:
    settings = replace(ServeSettings(), mdns=False, seed=7,
                       router=RouterConfig(explore_share=0.0))
    gateway = build_gateway(settings, forwarder=upstream, clock=FakeClock())
    gateway.mesh.upsert_raw(node("one", 1, tps=50), "test")
    return gateway


async def _streams(gateway: Gateway, n: int) -> list[tuple[float, str]]:
    loop = asyncio.get_running_loop()
    out = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app),
                                 base_url="http://gw", timeout=90) as client:
        for _ in range(n):
            started = loop.time()
            answer = await client.post("/v1/chat/completions", json=CHAT)
            out.append((loop.time() - started, answer.text))
    return out


def test_a_warm_route_falling_silent_mid_answer_is_cut_at_its_learned_gap() -> None:
    upstream = Stalling(stalls={MIN_SAMPLES + 2})
    answers = run_virtual(lambda: _streams(_gateway(upstream), MIN_SAMPLES + 2))
    took, text = answers[-1]
    assert FLOOR_S <= took < FLOOR_S + 0.5, took  # 3 × 10 ms is under the floor
    assert "w2" in text and "w3" not in text and '"error"' in text  # the stalled ending
    assert all(t < 0.1 and "[DONE]" in a for t, a in answers[:-1])
    assert upstream.closed == upstream.opened


def test_a_cold_route_keeps_the_idle_timeout() -> None:
    upstream = Stalling(stalls={2})
    answers = run_virtual(lambda: _streams(_gateway(upstream), 2))
    assert IDLE_S <= answers[-1][0] < IDLE_S + 0.5  # nothing learned yet: the idle timeout


def test_the_learned_gap_is_its_quantile_under_the_idle_ceiling() -> None:
    gaps = GapDeadlines(ceiling_s=5.0)
    for _ in range(MIN_SAMPLES):
        gaps.observe("r", 1.0)
    assert gaps.deadline_s("r") == pytest.approx(MARGIN * 1.0)
    for _ in range(64):
        gaps.observe("r", 2.0)
    assert gaps.deadline_s("r") is None  # 3 × 2 s is past the idle timeout: it holds


def test_a_learned_gap_becomes_the_responses_idle_timeout() -> None:
    gaps = GapDeadlines(ceiling_s=IDLE_S)
    stream = _Stream(Stalling(), stall=False)
    gaps.paced("r", stream)
    assert stream.idle_s == IDLE_S  # cold: untouched
    for _ in range(MIN_SAMPLES):
        gaps.observe("r", 0.01)
    paced = gaps.paced("r", stream)
    assert stream.idle_s == FLOOR_S
    paced.end("stream")  # it broke off while held to the learned gap: cold again
    assert gaps.deadline_s("r") is None
