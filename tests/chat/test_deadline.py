"""One deadline rule on every in-process path: a head that streams past `request_timeout_s`
is cut at the deadline (a stream ends with an SSE error event; nothing yet is a 504)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

import httpx
import pytest

from meshroute_middleware.app.serve import GatewayConfig, build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig, parse_node
from meshroute_middleware.core.providers.config import parse_providers_config
from meshroute_middleware.forwarding.client import ForwardTimeouts
from meshroute_middleware.forwarding.memory import ASGIForwarder
from meshroute_middleware.middleware import MeshRouteMiddleware, MiddlewareConfig, build_router

from ..conftest import FakeClock
from ..providers.fake_provider import FakeProvider, Reply
from ..upstream import FakeChat

pytestmark = pytest.mark.anyio
HEAD = "http://127.0.0.1:9"
STREAM_S = 8.0  # the head streams 80 tokens 0.1 s apart
CUT_BY_S = 5.0  # cut at the 1 s deadline: well before the stream would end (a loaded
# machine adds to the 1 s, never 4 s more)
NODE = {"node_id": "n1", "model": "m", "start": 0, "end": 39, "layers": 40, "url": HEAD,
        "tps": 10}
HI = [{"role": "user", "content": "hi"}]


def slow_head() -> FakeChat:
    return FakeChat("slow", tokens=80, token_delay_s=STREAM_S / 80)


PROVIDER = "http://127.0.0.1:1"


def gateway(head: FakeChat, provider: FakeProvider | None = None, **settings: Any) -> Any:
    """A gateway forwarding to `head` (and `provider`) in memory, with a 1 s deadline."""
    base = ServeSettings(mdns=False, seed=7, router=RouterConfig(explore_share=0.0),
                         request_timeout_s=1.0, state_file=":memory:")
    config = GatewayConfig.build(replace(base, **settings), {"KEY": "sk-test-key"})
    apps = {HEAD: head.app(), PROVIDER: (provider or FakeProvider()).app()}
    gw = build_gateway(config, clock=FakeClock(), forwarder=ASGIForwarder(
        apps, ForwardTimeouts(first_byte_s=30.0, idle_s=30.0)))
    gw.mesh.upsert_raw(NODE, "test")
    return gw


async def timed_post(app: Any, **body: Any) -> tuple[httpx.Response, float]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gw", timeout=30) as client:
        start = time.perf_counter()
        resp = await client.post("/v1/chat/completions", json={"messages": HI, **body})
        return resp, time.perf_counter() - start


def assert_cut(resp: httpx.Response, elapsed: float) -> None:
    assert elapsed < CUT_BY_S, f"streamed {elapsed:.2f} s past a 1 s deadline"
    assert resp.status_code == 200
    assert b"data: " in resp.content and b"deadline" in resp.content  # the SSE error event
    assert b"[DONE]" not in resp.content


async def test_forward_mode_cuts_a_stream_at_the_deadline() -> None:
    resp, elapsed = await timed_post(gateway(slow_head()).app, model="m", stream=True)
    assert_cut(resp, elapsed)


async def test_annotate_mode_cuts_the_apps_stream_at_the_deadline() -> None:
    router = build_router(RouterConfig(explore_share=0.0), seed=1, clock=FakeClock())
    router.upsert_node(parse_node(NODE))
    mw = MeshRouteMiddleware(slow_head().app(), MiddlewareConfig(
        mode="annotate", request_timeout_s=1.0), router=router)
    resp, elapsed = await timed_post(mw, model="m", stream=True)
    assert_cut(resp, elapsed)


async def test_annotate_mode_answers_504_when_the_app_says_nothing_by_the_deadline() -> None:
    router = build_router(RouterConfig(explore_share=0.0), seed=1, clock=FakeClock())
    router.upsert_node(parse_node(NODE))
    mw = MeshRouteMiddleware(slow_head().app(), MiddlewareConfig(  # not streamed: 8 s silent
        mode="annotate", request_timeout_s=1.0), router=router)
    resp, elapsed = await timed_post(mw, model="m")
    assert elapsed < CUT_BY_S
    assert resp.status_code == 504, resp.text
    assert resp.json()["error"]["code"] == "request_timeout"
    assert sum(a.in_flight for a in router.arms("m")) == 0  # nothing left in flight


def chain_settings() -> dict[str, Any]:
    """A chain whose first route is the mesh model `m` (its provider never reached)."""
    doc = {"routing": {"chain": ["m", "p/big"]}, "mesh": {"m": {"tier": "large"}},
           "providers": [{"name": "p", "base_url": PROVIDER + "/v1", "keys": ["env:KEY"],
                          "models": [{"id": "big", "tier": "large", "context": 4096}]}]}
    return {"providers": parse_providers_config(doc)}


async def test_a_chains_mesh_attempt_is_cut_at_the_deadline() -> None:
    gw = gateway(slow_head(), **chain_settings())
    resp, elapsed = await timed_post(gw.app, model="auto", route=["m"], stream=True)
    assert_cut(resp, elapsed)
    assert resp.headers["x-meshroute-route"] == "m|n1[0-39]"


async def test_a_chain_whose_route_gives_nothing_by_the_deadline_is_a_504() -> None:
    gw = gateway(slow_head(), **chain_settings())  # not streamed: nothing before 8 s
    resp, elapsed = await timed_post(gw.app, model="auto", route=["m"])
    assert elapsed < CUT_BY_S
    assert resp.status_code == 504, resp.text
    assert resp.json()["error"]["code"] == "request_timeout"
    assert resp.headers["x-meshroute-tried"] == "m"


async def test_a_chains_provider_stream_is_cut_at_the_deadline() -> None:
    provider = FakeProvider(models=("big",),
                            default=Reply.ok(tokens=80, token_delay_s=STREAM_S / 80))
    gw = gateway(slow_head(), provider, **chain_settings())
    resp, elapsed = await timed_post(gw.app, model="p/big", stream=True)
    assert_cut(resp, elapsed)
    assert resp.headers["x-meshroute-route"] == "p/big#1"
