"""Hedging over real sockets (issue 34): a real gateway (uvicorn, aiohttp's forwarder) and
two real heads on 127.0.0.1; the slow head's request is hedged on the fast one, and the slow
head sees its connection closed before it answered. Bounded by the wall clock: `alone`."""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import replace

import httpx
import pytest

from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig

from ..upstream import FakeChat, ServerThread
from .test_hedge import CHAT

PATIENCE_S = 30.0  # for the slow head to notice its caller left (a loaded machine)


@pytest.mark.alone
def test_a_hedge_over_real_sockets_closes_the_losers_connection() -> None:
    slow, fast = FakeChat("slow", header_delay_s=5.0), FakeChat("fast")
    with ExitStack() as stack:
        heads = [stack.enter_context(ServerThread(h.app())) for h in (slow, fast)]
        settings = replace(ServeSettings(), mdns=False, seed=7, hedge_after="200ms",
                           hedge_max_share=1.0, router=RouterConfig(explore_share=0.0))
        gateway = build_gateway(settings)
        for name, head, tps in (("slow", heads[0], 50), ("fast", heads[1], 10)):
            gateway.mesh.upsert_raw({"node_id": name, "model": "m", "start": 0, "end": 39,
                                     "layers": 40, "url": head.url, "tps": tps}, "test")
        gw = stack.enter_context(ServerThread(gateway.app))
        took = []
        for _ in range(6):  # the bandit tries the slow head first (its prior), then learns
            started = time.monotonic()
            answer = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, timeout=60)
            took.append(time.monotonic() - started)
            assert answer.status_code == 200 and answer.text.endswith("data: [DONE]\n\n")
            if slow.seen:
                break
        assert slow.seen, "no request went to the slow head"
        assert answer.headers["x-meshroute-route"] == "m|fast[0-39]"
        assert answer.headers["x-meshroute-mode"] == "hedge"
        assert took[-1] < 5.0  # the hedge answered, not the 5 s head
        deadline = time.monotonic() + PATIENCE_S
        while slow.cancelled < len(slow.seen) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert slow.cancelled == len(slow.seen)  # its connection closed before it answered
        assert gateway.hedging is not None and gateway.hedging.counts["won"] >= 1
