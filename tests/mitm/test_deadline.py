"""The addon honours the request's deadline (`meshroute_request_timeout_s`) as the gateway
does: a head that streams past it is cut there, and one that says nothing by then is a 504."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

pytest.importorskip("mitmproxy")

import httpx

from meshroute_middleware.app.mitm.flows import RelayedAnswer
from meshroute_middleware.app.mitm.relay import Parked
from meshroute_middleware.chat.attempts import Attempts, Measurement
from meshroute_middleware.core import RouterConfig, parse_node
from meshroute_middleware.middleware import build_router
from meshroute_middleware.telemetry.metrics import Telemetry
from tests.upstream import FakeChat

from .harness import Node, running_mitm

BASE = "http://mesh.invalid/v1"
MESSAGES = [{"role": "user", "content": "hi"}]
CUT_BY_S = 5.0  # the head streams for 8 s; the deadline is 1 s (room for a loaded machine)


def test_a_head_streaming_past_the_deadline_is_cut_there(tmp_path: Path) -> None:
    slow = FakeChat("slow", tokens=80, token_delay_s=0.1)
    with running_mitm(tmp_path, [Node("slow", app=slow.app())],
                      meshroute_request_timeout_s="1") as mitm:
        start = time.perf_counter()
        resp = httpx.post(BASE + "/chat/completions", timeout=20, proxy=mitm.proxy,
                          json={"model": "m", "stream": True, "messages": MESSAGES})
        elapsed = time.perf_counter() - start
        silent = httpx.post(BASE + "/chat/completions", timeout=20, proxy=mitm.proxy,
                            json={"model": "m", "messages": MESSAGES})  # nothing before 8 s
        silent_s = time.perf_counter() - start - elapsed
    assert elapsed < CUT_BY_S, f"streamed {elapsed:.2f} s past a 1 s deadline"
    assert resp.status_code == 200
    assert b"deadline" in resp.content and b"[DONE]" not in resp.content
    assert silent_s < CUT_BY_S
    assert silent.status_code == 504, silent.text
    assert silent.json()["error"]["code"] == "request_timeout"


def test_a_relayed_answer_is_measured_with_the_gateways_clamps() -> None:
    """The addon's measurement is chat.attempts' own: tokens clamp to the request's
    `max_tokens`, whatever usage the head claims."""
    async def outcome_tokens() -> int:
        router = build_router(RouterConfig(explore_share=0.0), seed=1)
        router.upsert_node(parse_node({"node_id": "n", "model": "m", "start": 0, "end": 39,
                                       "layers": 40, "url": "http://127.0.0.1:1"}))
        decision = router.choose("m", None, 5)
        m = Measurement(max_tokens=5)
        headers = [(b"content-type", b"application/json")]
        answer = RelayedAnswer(decision, m, Parked(None, False),  # type: ignore[arg-type]
                               "ticket", m.answer(headers),
                               Attempts(router, Telemetry(router), "m", 5))
        m.start -= 2.0  # two seconds of answer: the tokens/s clamp is not what binds
        answer.chunk(json.dumps({"choices": [{"message": {"content": "x"}}],
                                 "usage": {"completion_tokens": 1000}}).encode())
        return answer.outcome("").completion_tokens

    assert asyncio.run(outcome_tokens()) == 5
