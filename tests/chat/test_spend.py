"""Clients on the mesh path, with the library API: MeshRouteMiddleware(spend=ClientSpend(...))
admits a client's request before a route is chosen and records it once at its end."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
from typing import Any

import httpx
import pytest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from meshroute_middleware.chat.dialects import DIALECTS
from meshroute_middleware.chat.spend import ClientSpend, ledger_route
from meshroute_middleware.core import parse_node
from meshroute_middleware.core.clients import CLIENT_STATE, Client
from meshroute_middleware.core.clients_budget import CLIENTS
from meshroute_middleware.forwarding.memory import ASGIForwarder
from meshroute_middleware.http.request import parse_chat
from meshroute_middleware.middleware import MeshRouteMiddleware, MiddlewareConfig
from meshroute_middleware.state.limits import MemoryLimits

from ..conftest import FakeClock
from ..upstream import FakeChat

pytestmark = pytest.mark.anyio
T0 = 1_796_040_000.0
BOB = Client("bob", hashlib.sha256(b"bob").digest(), rpm=2)


async def answering_app(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body",
                "body": b'{"usage": {"prompt_tokens": 4, "completion_tokens": 9}}'})


def as_bob(app: ASGIApp) -> ASGIApp:
    """Test only: the client an authenticated request carries (branch "clients" sets it)."""
    async def wrapped(scope: Scope, receive: Receive, send: Send) -> None:
        scope.setdefault("state", {})[CLIENT_STATE] = BOB
        await app(scope, receive, send)
    return wrapped


def mesh_app(spend: ClientSpend) -> MeshRouteMiddleware:
    app = MeshRouteMiddleware(answering_app, MiddlewareConfig(mode="annotate"), spend=spend)
    app.router.upsert_node(parse_node({"node_id": "a", "model": "m", "start": 0, "end": 9,
                                       "layers": 10, "url": "http://127.0.0.1:1"}))
    return app


async def post(app: ASGIApp, n: int) -> list[httpx.Response]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as client:
        return [await client.post("/v1/chat/completions", json={"model": "m"})
                for _ in range(n)]


async def test_a_mesh_route_is_free_and_recorded_by_model() -> None:
    # a price for a provider route named like the mesh model must not apply to the mesh
    spend = ClientSpend(MemoryLimits(), prices={"m": (100.0, 100.0)}, clock=FakeClock(T0))
    app = mesh_app(spend)
    answers = await post(as_bob(app), 2)
    assert [a.status_code for a in answers] == [200, 200]
    assert answers[0].headers["x-meshroute-route"] == "m|a[0-9]"
    rows = await spend.usage_rows()
    assert [(r["client"], r["route"], r["requests"], r["prompt_tokens"],
             r["completion_tokens"], r["cost_usd"]) for r in rows] == [
        ("bob", "m", 2, 8, 18, 0.0)]


async def test_a_refused_request_never_reaches_the_router() -> None:
    spend = ClientSpend(MemoryLimits(), clock=FakeClock(T0))
    app = mesh_app(spend)
    answers = await post(as_bob(app), 3)
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[2].json()["error"]["code"] == "client_rate_limited"
    assert answers[2].headers["retry-after"] == "61"
    samples = app.router.routing_table()["models"]["m"]["candidates"][0]["samples"]
    assert samples == 2
    assert (await spend.usage_rows())[0]["requests"] == 2


async def test_requests_without_a_client_are_not_metered() -> None:
    spend = ClientSpend(MemoryLimits(), clock=FakeClock(T0))
    answers = await post(mesh_app(spend), 3)
    assert [a.status_code for a in answers] == [200] * 3
    assert await spend.usage_rows() == [] and spend.counters.requests == {}


async def test_an_answer_that_never_ends_is_recorded_as_an_error() -> None:
    async def cut_app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "more_body": True,
                    "body": b'data: {"choices": [{"delta": {"content": "x"}}]}\n\n'})
        raise RuntimeError("the app broke mid-stream")

    spend = ClientSpend(MemoryLimits(), clock=FakeClock(T0))
    app = MeshRouteMiddleware(cut_app, MiddlewareConfig(mode="annotate"), spend=spend)
    app.router.upsert_node(parse_node({"node_id": "a", "model": "m", "start": 0, "end": 9,
                                       "layers": 10, "url": "http://127.0.0.1:1"}))
    with contextlib.suppress(Exception):  # the server aborts the response
        await post(as_bob(app), 1)
    rows = await spend.usage_rows()
    assert [(r["requests"], r["errors"], r["completion_tokens"]) for r in rows] == [(1, 1, 1)]


@pytest.mark.parametrize(("header", "route"), [
    (b"fastco/big-model#2", ("fastco/big-model", True)),
    (b"m|a[0-9]->b[10-19]", ("m", False)),
    (None, ("none", False)),
    (b"", ("none", False)),
])
def test_the_ledger_route_of_an_answer(header: bytes | None, route: tuple[str, bool]) -> None:
    assert ledger_route(header) == route




async def test_a_store_that_fails_lets_clients_in_and_counts_them(
        caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryLimits()
    store.down = True
    spend = ClientSpend(store, clock=FakeClock(T0))
    answers = await post(as_bob(mesh_app(spend)), 3)  # over bob's rpm of 2: not enforced
    assert [a.status_code for a in answers] == [200] * 3
    assert spend.counters.requests == {("bob", "m", "200"): 3}
    assert spend.store_failures == 3  # each admission; nothing to settle after them
    assert sum("not enforced" in r.getMessage() for r in caplog.records) == 1
    store.down = False
    await post(as_bob(mesh_app(spend)), 1)
    assert (await spend.usage_rows())[0]["requests"] == 1


class _Toy:
    """A dialect whose answers carry no OpenAI `usage` (as Anthropic's `input_tokens` do not)."""

    path = "/v1/toy"

    def open(self, send: Send) -> Any:
        toy = self

        class Translation:
            def __init__(self) -> None:
                self.send = self._send

            async def _send(self, message: Message) -> None:
                if message["type"] == "http.response.body":
                    message = {**message, "body": b'{"toy": true}'}
                elif message["type"] == "http.response.start":
                    message = {**message, "headers": [(b"content-type", b"application/json")]}
                await send(message)

            def request(self, body: bytes) -> bytes:
                assert toy.path == "/v1/toy"
                return b'{"model": "m", "messages": []}'
        return Translation()


async def test_a_dialects_request_is_metered_before_its_answer_is_translated(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(DIALECTS, "/v1/toy", _Toy())
    spend = ClientSpend(MemoryLimits(), clock=FakeClock(T0))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=as_bob(mesh_app(spend))),
                                 base_url="http://t") as client:
        resp = await client.post("/v1/toy", content=b"{}")
    assert resp.json() == {"toy": True}
    rows = await spend.usage_rows()
    assert [(r["route"], r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [
        ("m", 4, 9)]


async def test_a_settle_the_store_failed_is_retried_until_it_lands() -> None:
    """Issue 32: the store away when a request ends; its usage is kept, and recorded once
    the store answers again (never dropped)."""
    store = MemoryLimits()

    async def app_then_store_away(scope: Scope, receive: Receive, send: Send) -> None:
        store.down = True  # admitted with the store up; it fails before the settle
        await answering_app(scope, receive, send)

    async def sleep(_: float) -> None:  # the retrier's backoff, without waiting it out
        await asyncio.sleep(0)

    spend = ClientSpend(store, clock=FakeClock(T0), sleep=sleep)
    app = MeshRouteMiddleware(app_then_store_away, MiddlewareConfig(mode="annotate"),
                              spend=spend)
    app.router.upsert_node(parse_node({"node_id": "a", "model": "m", "start": 0, "end": 9,
                                       "layers": 10, "url": "http://127.0.0.1:1"}))
    assert [a.status_code for a in await post(as_bob(app), 1)] == [200]
    assert len(spend.ledger) == 1
    for _ in range(20):  # still away: retried, still owed
        await asyncio.sleep(0)
    assert len(spend.ledger) == 1
    store.down = False
    for _ in range(100):
        if not spend.ledger:
            break
        await asyncio.sleep(0)
    assert not spend.ledger
    rows = await spend.usage_rows()
    assert [(r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [
        (1, 4, 9)]
    [bob] = await store.scan(CLIENTS)
    assert (bob["day_tokens"], bob["inflight"]) == (13, [])  # the reservation let go


async def test_a_mesh_stream_is_asked_for_usage_and_the_client_gets_none() -> None:
    chat = FakeChat("node", tokens=4, usage_in_stream=True)  # 3 prompt tokens, as it counts
    spend = ClientSpend(MemoryLimits(), clock=FakeClock(T0))
    app = MeshRouteMiddleware(chat.app(), MiddlewareConfig(),
                              forwarder=ASGIForwarder({"http://node": chat.app()}),
                              spend=spend)
    app.router.upsert_node(parse_node({"node_id": "a", "model": "m", "start": 0, "end": 9,
                                       "layers": 10, "url": "http://node"}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=as_bob(app)),
                                 base_url="http://t") as client:
        resp = await client.post("/v1/chat/completions", json={
            "model": "m", "stream": True, "messages": [{"role": "user", "content": "x" * 400}]})
    assert chat.seen[0]["body"]["stream_options"] == {"include_usage": True}
    assert resp.status_code == 200 and b'"usage"' not in resp.content
    assert resp.content.count(b"data: ") == 4 + 2  # the tokens, the stop chunk and [DONE]
    rows = await spend.usage_rows()
    assert [(r["route"], r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [
        ("m", 3, 4)]  # the node's count, not the estimate (104)


async def test_a_mesh_client_that_hangs_up_before_the_first_byte_is_charged_its_prompt(
        ) -> None:
    """Issue 32: the node was sent the request; its client leaves before any byte came."""
    chat = FakeChat("node", header_delay_s=5.0)  # thinks; notices the gateway leaving
    spend = ClientSpend(MemoryLimits(), clock=FakeClock(T0))
    app = MeshRouteMiddleware(chat.app(), MiddlewareConfig(),
                              forwarder=ASGIForwarder({"http://node": chat.app()}),
                              spend=spend)
    app.router.upsert_node(parse_node({"node_id": "a", "model": "m", "start": 0, "end": 9,
                                       "layers": 10, "url": "http://node"}))
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "x" * 4000}]})
    left = asyncio.Event()
    bodies = [{"type": "http.request", "body": body.encode(), "more_body": False}]
    sent: list[Message] = []

    async def receive() -> Message:
        if bodies:
            return bodies.pop()
        await left.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        sent.append(message)
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "raw_path": b"/v1/chat/completions", "query_string": b"", "scheme": "http",
             "http_version": "1.1", "client": ("127.0.0.1", 5), "server": ("127.0.0.1", 80),
             "headers": [(b"host", b"t"), (b"content-type", b"application/json")]}
    served = asyncio.ensure_future(as_bob(app)(scope, receive, send))
    for _ in range(500):  # until the node has it (bounded: 5 s)
        if chat.seen:
            break
        await asyncio.sleep(0.01)
    assert chat.seen and not sent
    left.set()
    await asyncio.wait_for(served, 10)
    rows = await spend.usage_rows()
    assert [(r["route"], r["requests"], r["prompt_tokens"], r["completion_tokens"],
             r["errors"]) for r in rows] == [("m", 1, 4000 // 4 + 4, 0, 1)]


async def test_at_shutdown_the_owed_settles_are_tried_once_more(
        caplog: pytest.LogCaptureFixture) -> None:
    store = MemoryLimits()

    async def never(_: float) -> None:  # the retrier waits past the test
        await asyncio.Event().wait()

    for up_at_shutdown, owed_after in ((True, 0), (False, 1)):
        spend = ClientSpend(store, clock=FakeClock(T0), sleep=never)
        store.down = False
        metered = await spend.admit(BOB, parse_chat(b'{"model": "m", "messages": []}'),
                                    _drop)
        store.down = True
        await metered.close()
        assert len(spend.ledger) == 1
        store.down = not up_at_shutdown
        await spend.aclose()
        assert len(spend.ledger) == owed_after
    assert sum("usage of 1 requests is lost" in r.getMessage() for r in caplog.records) == 1
    store.down = False
    assert [r["requests"] for r in await store.usage(None, 0)] == [1]  # the first one's


async def _drop(message: Message) -> None:
    pass



async def test_a_client_without_limits_is_estimated_only_when_its_answer_has_no_usage(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """It reserves nothing, so its prompt's estimate is read only when its answer says no
    usage: the body is not walked for it on every request (issue 32, "a key costs little")."""
    import meshroute_middleware.chat.spend as spend_module
    import meshroute_middleware.http.request as request_module

    calls: list[int] = []
    real = request_module.estimate

    def counted(body: Any) -> Any:
        calls.append(1)
        return real(body)

    for module in (request_module, spend_module):
        monkeypatch.setattr(module, "estimate", counted)
    free = Client("free", hashlib.sha256(b"free").digest())

    async def quiet_app(scope: Scope, receive: Receive, send: Send) -> None:
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"choices": []}'})

    spend = ClientSpend(MemoryLimits(), clock=FakeClock(T0))
    usage_app = mesh_app(spend)
    quiet = MeshRouteMiddleware(quiet_app, MiddlewareConfig(mode="annotate"), spend=spend,
                                router=usage_app.router)
    body = {"model": "m", "messages": [{"role": "user", "content": "x" * 40}]}  # 14 tokens
    for app, expected in ((usage_app, []), (usage_app, []), (quiet, [1])):
        async def as_free(scope: Scope, receive: Receive, send: Send,
                          app: ASGIApp = app) -> None:
            scope.setdefault("state", {})[CLIENT_STATE] = free
            await app(scope, receive, send)

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=as_free),
                                     base_url="http://t") as client:
            answer = await client.post("/v1/chat/completions", json=body)
        assert answer.status_code == 200
        assert calls == expected  # usage in the answer: no estimate; none: one
    rows = await spend.usage_rows()
    assert [(r["requests"], r["prompt_tokens"]) for r in rows] == [(3, 4 + 4 + 14)]
