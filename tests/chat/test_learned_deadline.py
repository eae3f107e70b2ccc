"""First-byte deadlines learned per route (issue 34): a route that answers its first byte in
milliseconds and then hangs once costs about its own normal worst case (at least
chat.deadlines.FLOOR_S), not the whole first-byte timeout."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import httpx
import pytest

from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.chat.deadlines import (
    FLOOR_S,
    MARGIN,
    MIN_SAMPLES,
    FirstByteDeadlines,
    learned_s,
)
from meshroute_middleware.core import RouterConfig
from meshroute_middleware.forwarding.client import ForwardTimeouts
from meshroute_middleware.forwarding.memory import ASGIForwarder

from ..conftest import FakeClock
from ..upstream import FakeChat

pytestmark = pytest.mark.anyio
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def node(node_id: str, port: int, tps: float) -> dict[str, Any]:
    return {"node_id": node_id, "model": "m", "start": 0, "end": 39, "layers": 40,
            "url": f"http://127.0.0.1:{port}", "tps": tps}


def test_a_cold_route_has_no_learned_deadline_and_a_warm_one_has_its_quantile() -> None:
    deadlines = FirstByteDeadlines()
    for _ in range(MIN_SAMPLES - 1):
        deadlines.observe("r", 0.02)
    assert deadlines.deadline_s("r") is None  # cold: the first-byte timeout holds
    deadlines.observe("r", 0.02)
    assert deadlines.deadline_s("r") == FLOOR_S  # 3 × 20 ms is under the floor
    for _ in range(64):
        deadlines.observe("slow", 2.0)
    assert deadlines.deadline_s("slow") == pytest.approx(MARGIN * 2.0)
    deadlines.forget("slow")  # cut at its deadline: cold again
    assert deadlines.deadline_s("slow") is None
    assert learned_s([0.1] * 99 + [0.9]) == pytest.approx(MARGIN * 0.9)  # the high quantile


async def test_a_route_that_hangs_once_is_cut_at_its_learned_deadline() -> None:
    quick, other = FakeChat("quick"), FakeChat("other", token_delay_s=0.01)  # slower
    apps = {"http://127.0.0.1:1": quick.app(), "http://127.0.0.1:2": other.app()}
    forwarder = ASGIForwarder(apps, ForwardTimeouts())  # the default 60 s: nothing configured
    settings = replace(ServeSettings(), mdns=False, seed=7,
                       router=RouterConfig(explore_share=0.0))
    gateway = build_gateway(settings, forwarder=forwarder, clock=FakeClock())
    gateway.mesh.upsert_raw(node("quick", 1, tps=50), "test")
    gateway.mesh.upsert_raw(node("other", 2, tps=10), "test")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gateway.app),
                                 base_url="http://gw", timeout=90) as client:
        for _ in range(100):  # first bytes in milliseconds: until the quick route is warm
            if len(quick.seen) >= MIN_SAMPLES + 2:
                break
            assert (await client.post("/v1/chat/completions", json=CHAT)).status_code == 200
        assert len(quick.seen) >= MIN_SAMPLES + 2
        quick.header_delay_s = 30.0  # now it hangs
        for _ in range(20):  # until a request meets it (the bandit may send a few elsewhere)
            before = len(quick.seen)
            started = time.monotonic()
            answer = await client.post("/v1/chat/completions", json=CHAT)
            took = time.monotonic() - started
            if len(quick.seen) > before:
                break
    assert len(quick.seen) > before, "no request went to the quick route once it hung"
    assert answer.status_code == 200
    assert answer.headers["x-meshroute-route"] == "m|other[0-39]"
    assert took < 2.0, took  # FLOOR_S (1 s) and the fallback, not the 60 s timeout
    rows = {r["head"]: r for r in gateway.router.routing_table()["models"]["m"]["candidates"]}
    assert rows["quick"]["last_error"] == "timeout"
