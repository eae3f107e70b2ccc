"""Issue 11, item 1 — credentials stay home: a node never sees the client's credentials, and
a node's cookies, hop-by-hop headers and date/server never reach the client (doubled)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from meshroute_middleware.app.settings import load_settings

from ..chat.test_forward import Mesh, chat, node
from ..upstream import FakeChat, ServerThread
from .edge_util import EdgeGateway

pytestmark = pytest.mark.anyio

CREDENTIALS = {"authorization": "Bearer sk-client-secret", "cookie": "session=abc",
               "proxy-authorization": "Basic cHJveHk6cHc=", "x-api-key": "sk-other"}


async def test_a_node_never_sees_the_clients_credentials() -> None:
    head = FakeChat("a")
    mesh = Mesh({1: head})
    mesh.add(node("a", 0, 39, 1))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(),
                                 headers={**CREDENTIALS, "x-request-id": "r-1"})
    assert resp.status_code == 200, resp.text
    seen = head.seen[-1]["headers"]
    assert not set(CREDENTIALS) & set(seen), seen
    assert seen["x-request-id"] == "r-1"  # everything else still goes through


async def test_the_forward_header_allow_list_lets_named_credentials_through() -> None:
    head = FakeChat("a")
    mesh = Mesh({1: head}, forward_headers=("Authorization",))
    mesh.add(node("a", 0, 39, 1))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(), headers=CREDENTIALS)
    assert resp.status_code == 200, resp.text
    seen = head.seen[-1]["headers"]
    assert seen["authorization"] == "Bearer sk-client-secret"
    assert "cookie" not in seen and "x-api-key" not in seen


def test_forwardable_drops_credentials_unless_allowed() -> None:
    from meshroute_middleware.chat.headers import allow_list, forwardable
    scope = {"headers": [(k.encode(), v.encode()) for k, v in CREDENTIALS.items()]
             + [(b"accept", b"*/*")]}
    assert forwardable(scope) == [(b"accept", b"*/*")]
    allowed = forwardable(scope, allow_list(["X-Api-Key", " cookie "]))
    assert {k for k, _ in allowed} == {b"accept", b"x-api-key", b"cookie"}
    # proxy-authorization is hop-by-hop: never forwarded, even when named
    assert b"proxy-authorization" not in {k for k, _ in forwardable(
        scope, allow_list(["proxy-authorization"]))}


def test_forward_header_flag_is_repeatable_and_comma_separated() -> None:
    settings = load_settings({"forward_headers": ["authorization", "x-api-key,x-org"]})
    assert settings.forward_headers == ("authorization", "x-api-key", "x-org")
    assert settings.middleware().forward_headers == settings.forward_headers
    env = load_settings({}, {"MESHROUTE_FORWARD_HEADERS": "cookie, authorization"})
    assert env.forward_headers == ("cookie", "authorization")
    assert load_settings({}).forward_headers == ()


def _node_with_headers(**extra: Any) -> FakeChat:
    return FakeChat("a", extra_headers={"set-cookie": "node=1; Path=/",
                                        "x-node-info": "kept", **extra})


async def test_a_nodes_cookies_and_meshroute_headers_do_not_reach_the_client() -> None:
    mesh = Mesh({1: _node_with_headers(**{"x-meshroute-route": "forged"})})
    mesh.add(node("a", 0, 39, 1))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat())
    assert resp.status_code == 200
    assert "set-cookie" not in resp.headers
    assert resp.headers["x-node-info"] == "kept"
    assert resp.headers.get_list("x-meshroute-route") == ["m|a[0-39]"]


def test_real_servers_send_one_date_and_one_server_header_no_cookie() -> None:
    """A node under uvicorn adds its own date/server; the gateway's uvicorn adds its own."""
    head = _node_with_headers()
    with ServerThread(head.app()) as up, EdgeGateway() as gw:
        assert gw.register("a", up.url).status_code in (200, 201)
        resp = httpx.post(gw.url + "/v1/chat/completions", json=chat(),
                          headers=CREDENTIALS, timeout=10)
        assert resp.status_code == 200, resp.text
        assert len(resp.headers.get_list("date")) == 1
        assert len(resp.headers.get_list("server")) == 1
        assert "set-cookie" not in resp.headers
        assert not set(CREDENTIALS) & set(head.seen[-1]["headers"])
        stream = httpx.post(gw.url + "/v1/chat/completions", json=chat(stream=True),
                            timeout=10)
        assert len(stream.headers.get_list("server")) == 1
