"""issue 24 on the mesh path: a node's 429 `Retry-After` reaches the exhaustion 429 (the
soonest of every failed route's, parsed and bounded: a hostile node cannot push a client away
for long, or make it spin), in forward mode and annotate mode, in-memory and over real
sockets with the official openai client."""

from __future__ import annotations

import email.utils
import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from meshroute_middleware.app.config import GatewayConfig
from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig, parse_node
from meshroute_middleware.core.providers.keys import RETRY_AFTER_MAX_S
from meshroute_middleware.middleware import MeshRouteMiddleware, MiddlewareConfig, build_router

from ..conftest import FakeClock
from ..upstream import FakeChat, ServerThread
from .test_forward import Mesh, assert_openai_error, chat, node

pytestmark = pytest.mark.anyio
CAP = int(RETRY_AFTER_MAX_S)


def http_date(seconds_ahead: float) -> str:
    return email.utils.formatdate(time.time() + seconds_ahead, usegmt=True)


def limited(name: str, retry_after: str | None) -> FakeChat:
    headers = {} if retry_after is None else {"Retry-After": retry_after}
    return FakeChat(name, status=429, extra_headers=headers)


async def forward_429(a: str | None, b: str | None, other: int = 429) -> httpx.Response:
    """Forward mode over in-memory heads: `a` answers 429 (Retry-After `a`), `b` `other`."""
    second = limited("b", b) if other == 429 else FakeChat("b", status=other)
    mesh = Mesh({1: limited("a", a), 2: second})
    mesh.add(node("a", 0, 39, 1), node("b", 0, 39, 2))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat())
    assert mesh.heads[1].seen and mesh.heads[2].seen, "both routes must have been tried"
    assert_openai_error(resp, 429, "rate_limited")
    return resp


async def test_forward_mode_429_carries_the_soonest_retry_after() -> None:
    for first, second in (("7", "3"), ("3", "7")):  # whichever route is tried first
        resp = await forward_429(first, second)
        assert resp.headers["retry-after"] == "3"


async def test_forward_mode_fractions_round_up_and_dates_are_read() -> None:
    assert (await forward_429("2.2", None)).headers["retry-after"] == "3"
    seconds = int((await forward_429(http_date(60), "600")).headers["retry-after"])
    assert 50 <= seconds <= 61  # an HTTP date a minute ahead (second resolution, slow machine)


async def test_forward_mode_429_beside_a_500_keeps_the_nodes_retry_after() -> None:
    assert (await forward_429("5", None, other=500)).headers["retry-after"] == "5"


@pytest.mark.parametrize(("a", "b", "expected"), [
    ("99999999999", None, str(CAP)),  # huge: capped at an hour
    ("inf", "garbage", str(CAP)),
    ("-5", "soon", None),  # negative and garbage: ignored, no Retry-After at all
    ("nan", "", None),
    ("-5", "4", "4"),  # a hostile node cannot hide an honest one's
    ("Wed, 31 Dec 1969 23:00:00 GMT", None, None),  # a date in the past
])
async def test_forward_mode_hostile_retry_after_is_bounded_or_ignored(
        a: str, b: str | None, expected: str | None) -> None:
    resp = await forward_429(a, b)
    assert resp.headers.get("retry-after") == expected


async def test_forward_mode_without_retry_after_sends_none() -> None:
    assert "retry-after" not in (await forward_429(None, None)).headers


# -- annotate mode: the wrapped app answers 429 for each head, as its node told it ----------

def limited_app(retry_after: dict[str, str | None]) -> Starlette:
    """An app that answers 429 for every head, with that head's Retry-After (None: none)."""
    async def answer(request: Request) -> Response:
        head = request.scope["state"]["meshroute"]["plan"][0]["node_id"]
        value = retry_after[head]
        return JSONResponse({"error": {"message": f"{head} is busy", "type": "x"}},
                            status_code=429,
                            headers={} if value is None else {"Retry-After": value})
    return Starlette(routes=[Route("/v1/chat/completions", answer, methods=["POST"])])


async def annotate_429(retry_after: dict[str, str | None]) -> httpx.Response:
    router = build_router(RouterConfig(explore_share=0.0), seed=1, clock=FakeClock())
    mw = MeshRouteMiddleware(limited_app(retry_after), MiddlewareConfig(mode="annotate"),
                             router=router)
    for node_id, tps in (("a", 30.0), ("b", 10.0)):
        mw.router.upsert_node(parse_node({"node_id": node_id, "model": "m", "start": 0,
                                          "end": 9, "layers": 10,
                                          "url": "http://127.0.0.1:1", "tps": tps}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw),
                                 base_url="http://t") as client:
        resp = await client.post("/v1/chat/completions", json={"model": "m"})
    assert resp.status_code == 429, resp.text
    return resp


async def test_annotate_mode_429_carries_the_soonest_retry_after() -> None:
    # a (faster) is tried first, b last: the last answer's own header would say 7
    assert (await annotate_429({"a": "3", "b": "7"})).headers["retry-after"] == "3"
    assert (await annotate_429({"a": "7", "b": "3"})).headers["retry-after"] == "3"
    seconds = int((await annotate_429({"a": http_date(60), "b": None})).headers["retry-after"])
    assert 50 <= seconds <= 61


@pytest.mark.parametrize(("a", "b", "expected"), [
    ("99999999999", "garbage", str(CAP)),
    ("-5", "garbage", None),  # the app's last (hostile) header is not passed on as it was
    (None, None, None),
])
async def test_annotate_mode_hostile_retry_after_is_bounded_or_ignored(
        a: str | None, b: str | None, expected: str | None) -> None:
    resp = await annotate_429({"a": a, "b": b})
    assert resp.headers.get_list("retry-after") == ([] if expected is None else [expected])


# -- the official openai client against a real gateway over real sockets (aiohttp) ----------

@pytest.fixture
def gateway_over_429s() -> Iterator[tuple[str, list[FakeChat]]]:
    heads = [limited("a", "7"), limited("b", "3")]
    settings = ServeSettings(mdns=False, seed=3, router=RouterConfig(explore_share=0.0),
                             first_byte_timeout_s=2.0, connect_timeout_s=1.0,
                             state_file=":memory:")
    with ExitStack() as stack:
        servers = [stack.enter_context(ServerThread(h.app())) for h in heads]
        gateway = build_gateway(GatewayConfig.build(settings, {}))
        server = stack.enter_context(ServerThread(gateway.app))
        for head, up, tps in zip(heads, servers, (30.0, 8.0), strict=True):
            joined = httpx.post(f"{server.url}/v1/nodes", json={
                "node_id": head.name, "model": "m", "start": 0, "end": 39, "layers": 40,
                "url": up.url, "tps": tps})
            assert joined.status_code in (200, 201), joined.text
        yield server.url, heads


@pytest.mark.parametrize("stream", [False, True])
def test_openai_client_sees_rate_limit_error_with_retry_after(
        gateway_over_429s: tuple[str, list[FakeChat]], stream: bool) -> None:
    url, heads = gateway_over_429s
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    messages: Any = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.RateLimitError) as caught:
        client.chat.completions.create(model="m", messages=messages, stream=stream)
    assert caught.value.response.headers["retry-after"] == "3"
    assert caught.value.code == "rate_limited"
    assert all(h.seen for h in heads)
