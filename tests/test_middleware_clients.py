"""Client keys in MeshRouteMiddleware (issue 24), in process: every inference path needs a
key, the key never leaves the gateway, the client reaches the app and the ChatRequest."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from meshroute_middleware.chat import dialects
from meshroute_middleware.core import parse_node
from meshroute_middleware.core.clients import CLIENT_STATE, Client, key_digest
from meshroute_middleware.forwarding.memory import ASGIForwarder
from meshroute_middleware.http.auth import ClientAuth
from meshroute_middleware.middleware import MeshRouteMiddleware, MiddlewareConfig

from .upstream import FakeChat

pytestmark = pytest.mark.anyio
KEY = "mr-alice-0123456789abcdef"
ALICE = Client("alice", key_digest(KEY), models=("m", "auto"))
BOB = Client("bob", key_digest("mr-bob-0123456789abcdef"))
HI = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def node(node_id: str, model: str = "m") -> Any:
    return parse_node({"node_id": node_id, "model": model, "start": 0, "end": 9, "layers": 10,
                       "url": "http://node", "tps": 10.0})


def forwarding(chat: FakeChat, **config: Any) -> MeshRouteMiddleware:
    app = MeshRouteMiddleware(chat.app(), MiddlewareConfig(clients=(ALICE, BOB), **config),
                              forwarder=ASGIForwarder({"http://node": chat.app()}))
    app.router.upsert_node(node("a"))
    app.router.upsert_node(node("o", "other"))
    return app


async def post(app: Any, path: str = "/v1/chat/completions",
               headers: dict[str, str] | None = None, body: Any = None) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as client:
        return await client.post(path, json=HI if body is None else body, headers=headers)


async def test_without_a_key_401_missing_api_key_and_nothing_forwarded() -> None:
    chat = FakeChat("node")
    resp = await post(forwarding(chat))
    assert resp.status_code == 401
    assert resp.json()["error"] == {"message": resp.json()["error"]["message"],
                                    "type": "authentication_error", "code": "missing_api_key"}
    assert resp.headers["www-authenticate"].startswith("Bearer")
    assert chat.seen == []


@pytest.mark.parametrize("headers", [
    {"authorization": "Bearer mr-alice-0123456789abcdeX"},
    {"authorization": f"Basic {KEY}"},  # not a bearer token: no key presented
    {"x-api-key": KEY[:-1]},
])
async def test_a_wrong_key_is_401(headers: dict[str, str]) -> None:
    chat = FakeChat("node")
    resp = await post(forwarding(chat), headers=headers)
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] in {"invalid_api_key", "missing_api_key"}
    assert chat.seen == []


@pytest.mark.parametrize("headers", [{"authorization": f"Bearer {KEY}"},
                                     {"authorization": f"bearer  {KEY} "},
                                     {"x-api-key": KEY}])
async def test_a_good_key_is_served_and_never_forwarded(headers: dict[str, str]) -> None:
    chat = FakeChat("node")
    # even when the operator lets nodes see `authorization` and `x-api-key`
    app = forwarding(chat, forward_headers=("authorization", "x-api-key"))
    resp = await post(app, headers={**headers, "x-other": "kept"})
    assert resp.status_code == 200, resp.text
    (seen,) = chat.seen
    assert "authorization" not in seen["headers"] and "x-api-key" not in seen["headers"]
    assert seen["headers"]["x-other"] == "kept"
    assert KEY not in repr(seen)


async def test_without_clients_the_operator_allow_list_still_forwards_authorization() -> None:
    chat = FakeChat("node")
    app = MeshRouteMiddleware(chat.app(), MiddlewareConfig(forward_headers=("authorization",)),
                              forwarder=ASGIForwarder({"http://node": chat.app()}))
    app.router.upsert_node(node("a"))
    resp = await post(app, headers={"authorization": "Bearer node-credential"})
    assert resp.status_code == 200
    assert chat.seen[0]["headers"]["authorization"] == "Bearer node-credential"


async def test_a_mesh_model_outside_the_allow_list_is_403() -> None:
    chat = FakeChat("node")
    resp = await post(forwarding(chat), headers={"authorization": f"Bearer {KEY}"},
                      body={**HI, "model": "other"})
    assert resp.status_code == 403
    assert resp.json()["error"]["type"] == "permission_error"
    assert resp.json()["error"]["code"] == "model_not_allowed"
    assert chat.seen == []
    bob = await post(forwarding(chat), headers={"x-api-key": "mr-bob-0123456789abcdef"},
                     body={**HI, "model": "other"})
    assert bob.status_code == 200  # bob has no allow-list


async def test_the_annotated_app_gets_the_client_and_never_the_key() -> None:
    got: list[Scope] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        got.append(scope)
        await receive()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})

    mw = MeshRouteMiddleware(app, MiddlewareConfig(mode="annotate", clients=(ALICE,)))
    mw.router.upsert_node(node("a"))
    resp = await post(mw, headers={"x-api-key": KEY})
    assert resp.status_code == 200
    (scope,) = got
    assert scope["state"][CLIENT_STATE] is ALICE
    assert not {k for k, _ in scope["headers"]} & {b"authorization", b"x-api-key"}


async def test_other_endpoints_need_no_client_key() -> None:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": 204, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    mw = MeshRouteMiddleware(app, MiddlewareConfig(clients=(ALICE,)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw),
                                 base_url="http://t") as client:
        assert (await client.get("/v1/routing")).status_code == 204
        assert (await client.get("/v1/chat/completions")).status_code == 204


@dataclass
class _Upper:
    """A pass-through translation that records the bodies it was given."""

    send: Send
    requests: list[bytes]

    def request(self, body: bytes) -> bytes:
        self.requests.append(body)
        return body


@dataclass
class _Dialect:
    path: str
    requests: list[bytes]

    def open(self, send: Send) -> _Upper:
        return _Upper(send, self.requests)


@pytest.fixture
def dialect() -> Iterator[_Dialect]:
    registered = _Dialect("/v1/other-api", [])
    dialects.DIALECTS[registered.path] = registered
    try:
        yield registered
    finally:
        del dialects.DIALECTS[registered.path]


async def test_every_dialect_path_needs_the_key_before_its_body_is_read(
        dialect: _Dialect) -> None:
    chat = FakeChat("node")
    app = forwarding(chat)
    resp = await post(app, dialect.path)
    assert resp.status_code == 401 and resp.json()["error"]["code"] == "missing_api_key"
    assert dialect.requests == []  # refused before the body was read
    resp = await post(app, dialect.path, headers={"x-api-key": KEY})
    assert resp.status_code == 200 and len(dialect.requests) == 1
    assert "x-api-key" not in chat.seen[0]["headers"]


def test_refused_keys_log_once_a_second_with_the_count(caplog: pytest.LogCaptureFixture
                                                       ) -> None:
    now = [100.0]
    auth = ClientAuth((ALICE,), clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="meshroute.middleware"):
        for _ in range(5):
            auth.log_refusal("/v1/chat/completions", "invalid_api_key")
        now[0] += 1.0
        auth.log_refusal("/v1/chat/completions", "missing_api_key")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "meshroute: refused a request to /v1/chat/completions: 401 invalid_api_key "
        "(0 more since the last line)",
        "meshroute: refused a request to /v1/chat/completions: 401 missing_api_key "
        "(4 more since the last line)"]


async def test_a_refusal_is_counted_by_its_code() -> None:
    app = forwarding(FakeChat("node"))
    await post(app)
    await post(app, headers={"x-api-key": "wrong"})
    assert app.telemetry.rejected_by[("http", "missing_api_key")] == 1
    assert app.telemetry.rejected_by[("http", "invalid_api_key")] == 1


def test_two_clients_with_one_key_are_refused_by_the_middleware_too() -> None:
    with pytest.raises(ValueError, match="'bob': its key is 'alice''s too"):
        MeshRouteMiddleware(FakeChat().app(), MiddlewareConfig(
            clients=(ALICE, Client("bob", ALICE.key_digest))))


def test_the_openapi_document_says_chat_may_need_a_client_key() -> None:
    from meshroute_middleware.http.openapi import openapi_document

    chat = openapi_document()["paths"]["/v1/chat/completions"]["post"]
    assert {"401", "403"} <= set(chat["responses"])
    assert {"apiKey": []} in chat["security"] and {} in chat["security"]
