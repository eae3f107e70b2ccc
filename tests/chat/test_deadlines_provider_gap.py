"""The gap between two chunks learned per provider key (issue 34), by the mesh's rule
(chat/deadlines.py `GapDeadlines`): a provider streaming chunks ~20 ms apart that falls
silent mid-answer is cut at its learned gap (at least FLOOR_S), not at the idle timeout
(30 s), and the stream ends as a broken one; a cold key keeps the idle timeout. On a
virtual clock (tests/chat/virtual_time.py): no wall-clock bound."""

from __future__ import annotations

import asyncio

import httpx

from meshroute_middleware.app.gateway import Gateway
from meshroute_middleware.chat.deadlines import FLOOR_S, MIN_SAMPLES

from .test_deadlines_gap import IDLE_S, Stalling
from .test_deadlines_keys import _client, _gateway
from .virtual_time import run_virtual

STREAM = {"model": "auto", "messages": [{"role": "user", "content": "hi"}], "stream": True}


async def _streams(gateway: Gateway, n: int) -> list[tuple[float, httpx.Response]]:
    loop = asyncio.get_running_loop()
    out = []
    async with _client(gateway) as client:
        for _ in range(n):
            started = loop.time()
            answer = await client.post("/v1/chat/completions", json=STREAM)
            out.append((loop.time() - started, answer))
    return out


def test_a_warm_provider_stream_falling_silent_is_cut_at_its_learned_gap() -> None:
    provider = Stalling(gap_s=0.02, stalls={MIN_SAMPLES + 2})
    answers = run_virtual(lambda: _streams(_gateway(provider), MIN_SAMPLES + 2))
    took, answer = answers[-1]
    assert answer.status_code == 200
    assert FLOOR_S <= took < FLOOR_S + 0.5, took  # 3 × 20 ms is under the floor: not 30 s
    assert "w2" in answer.text and "w3" not in answer.text
    assert '"error"' in answer.text and "[DONE]" not in answer.text  # a broken stream's end
    assert all(t < 0.5 and "[DONE]" in a.text for t, a in answers[:-1])
    assert provider.closed == provider.opened


def test_a_cold_provider_key_keeps_the_idle_timeout() -> None:
    provider = Stalling(gap_s=0.02, stalls={2})
    answers = run_virtual(lambda: _streams(_gateway(provider), 2))
    took, answer = answers[-1]
    assert IDLE_S <= took < IDLE_S + 0.5, took  # nothing learned yet: the idle timeout
    assert '"error"' in answer.text


def test_a_provider_cut_at_its_learned_gap_is_cold_again() -> None:
    provider = Stalling(gap_s=0.02, stalls={MIN_SAMPLES + 2, MIN_SAMPLES + 3})
    answers = run_virtual(lambda: _streams(_gateway(provider), MIN_SAMPLES + 3))
    assert answers[-2][0] < FLOOR_S + 0.5
    assert answers[-1][0] >= IDLE_S  # forgotten: the ceiling until it relearns
