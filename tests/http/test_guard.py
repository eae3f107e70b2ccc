"""The request guard's rules (http/guard.py), table-driven on the pure Policy, and once
through ASGI with the settings table's options."""

from __future__ import annotations

import httpx
import pytest

from meshroute_middleware.app.settings import load_settings
from meshroute_middleware.http.guard import GuardConfig, Policy, RequestGuard, host_of

OWN = frozenset({"tracker1", "tracker1.lan", "10.0.0.5"})


def policy(**config: object) -> Policy:
    return Policy(GuardConfig(**config), OWN)  # type: ignore[arg-type]


@pytest.mark.parametrize(("header", "host"), [
    ("127.0.0.1:8080", "127.0.0.1"), ("[::1]:8080", "::1"), ("::1", "::1"),
    ("Example.COM.", "example.com"), ("gw", "gw"), ("[fe80::1%25eth0]", "fe80::1%25eth0")])
def test_host_of(header: str, host: str) -> None:
    assert host_of(header) == host


@pytest.mark.parametrize(("host", "server", "allowed", "ok"), [
    (None, "127.0.0.1", (), True),  # HTTP/1.0 without Host: no browser
    ("127.0.0.1:8080", "127.0.0.1", (), True),
    ("127.9.9.9", "127.0.0.1", (), True),
    ("localhost:8080", "127.0.0.1", (), True),
    ("app.localhost", "127.0.0.1", (), True),
    ("[::1]:1", "::1", (), True),
    ("[::ffff:127.0.0.1]", "127.0.0.1", (), True),
    ("tracker1:8080", "10.0.0.5", (), True),  # the machine's own name
    ("10.0.0.5:8080", "10.0.0.5", (), True),  # one of its addresses
    ("192.168.1.9:8080", "192.168.1.9", (), True),  # the address this connection reached
    ("evil.example", "127.0.0.1", (), False),  # DNS rebinding
    ("evil.example:8080", "127.0.0.1", (), False),
    ("localhost.evil.example", "127.0.0.1", (), False),
    ("10.0.0.6", "10.0.0.5", (), False),
    ("gw.example.com", "127.0.0.1", ("gw.example.com",), True),
    ("gw.example.com:443", "127.0.0.1", ("GW.example.com:443",), True),
    ("a.example.com", "127.0.0.1", (".example.com",), True),
    ("example.com", "127.0.0.1", (".example.com",), True),
    ("badexample.com", "127.0.0.1", (".example.com",), False),
    ("anything", "127.0.0.1", ("*",), True),
])
def test_host_rule(host: str | None, server: str, allowed: tuple[str, ...], ok: bool) -> None:
    refusal = policy(allowed_hosts=allowed).host_refusal(host, server)
    assert (refusal is None) is ok
    if refusal is not None:
        assert (refusal.status, refusal.code) == (421, "invalid_host")


def test_the_listening_address_is_one_of_ours() -> None:
    assert policy(listen_host="10.9.9.9").host_refusal("10.9.9.9", "127.0.0.1") is None
    assert policy(listen_host="0.0.0.0").host_refusal("0.0.0.0", "127.0.0.1") is not None


@pytest.mark.parametrize(("method", "path", "origin", "ctype", "code"), [
    ("GET", "/v1/routing", "http://evil.example", None, None),  # reads: Host rule only
    ("POST", "/v1/nodes", None, "application/json", None),
    ("POST", "/v1/nodes", None, "application/json; charset=utf-8", None),
    ("POST", "/v1/nodes", None, "application/merge-patch+json", None),
    ("POST", "/v1/nodes", None, None, None),  # curl -X POST with no body
    ("DELETE", "/v1/nodes/gpu-a", None, None, None),
    ("POST", "/v1/nodes", None, "text/plain", "invalid_content_type"),
    ("POST", "/v1/cooldowns/clear", None, "application/x-www-form-urlencoded",
     "invalid_content_type"),
    ("POST", "/v1/cooldowns/clear", None, "multipart/form-data; boundary=x",
     "invalid_content_type"),
    ("POST", "/v1/some/future/admin", None, "text/plain", "invalid_content_type"),
    ("POST", "/v1/nodes", "http://127.0.0.1:5555", "application/json", "origin_not_allowed"),
    ("POST", "/v1/nodes", "null", "application/json", "origin_not_allowed"),
    ("DELETE", "/v1/nodes/gpu-a", "http://evil.example", None, "origin_not_allowed"),
    ("POST", "/v1/chat/completions", "http://127.0.0.1:5555", "text/plain",
     "origin_not_allowed"),
    ("POST", "/v1/chat/completions", None, "text/plain", None),  # not a browser: as before
    ("POST", "/v1/nodes", "http://127.0.0.1:8080", "application/json", None),  # same origin
    ("POST", "/v1/nodes", "http://app.example", "application/json", None),  # allowed
    ("POST", "/v1/chat/completions", "http://APP.example/", "text/plain", None),
    ("POST", "/v1/nodes", "http://app.example", "text/plain", "invalid_content_type"),
])
def test_write_rule(method: str, path: str, origin: str | None, ctype: str | None,
                    code: str | None) -> None:
    refusal = policy(allowed_origins=("http://app.example",)).write_refusal(
        method, path, origin, ctype, "127.0.0.1:8080")
    assert (None if refusal is None else refusal.code) == code
    if refusal is not None:
        assert refusal.status == 403


@pytest.mark.anyio
async def test_the_guard_answers_openai_errors_and_counts_them() -> None:
    reached: list[str] = []

    async def app(scope: object, receive: object, send: object) -> None:
        reached.append("app")
        await send({"type": "http.response.start", "status": 204,  # type: ignore[operator]
                    "headers": []})
        await send({"type": "http.response.body", "body": b""})  # type: ignore[operator]

    counted: list[tuple[str, str]] = []
    settings = load_settings({}, {"MESHROUTE_ALLOWED_ORIGINS": "http://app.example",
                                  "MESHROUTE_ALLOWED_HOSTS": "gw.example,.lan"})
    assert settings.allowed_origins == ("http://app.example",)
    assert settings.allowed_hosts == ("gw.example", ".lan")
    guard = RequestGuard(app, settings.guard(), reject=lambda s, r: counted.append((s, r)))
    transport = httpx.ASGITransport(app=guard)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        refused = await c.post("/v1/nodes", content=b"{}",
                               headers={"content-type": "text/plain"})
        foreign = await c.post("/v1/nodes", json={}, headers={"origin": "http://x.example"})
        rebound = await c.get("/v1/routing", headers={"host": "evil.example"})
        ok = [await c.post("/v1/nodes", json={}, headers={"origin": "http://app.example"}),
              await c.get("/v1/routing", headers={"host": "x.lan"}),
              await c.get("/v1/routing", headers={"host": "gw.example:8443"})]
    assert [r.status_code for r in (refused, foreign, rebound)] == [403, 403, 421]
    assert [r.json()["error"]["code"] for r in (refused, foreign, rebound)] == [
        "invalid_content_type", "origin_not_allowed", "invalid_host"]
    assert [r.json()["error"]["type"] for r in (refused, rebound)] == [
        "permission_error", "invalid_request_error"]
    assert [r.status_code for r in ok] == [204, 204, 204] and len(reached) == 3
    assert counted == [("http", "403 invalid_content_type"), ("http", "403 origin_not_allowed"),
                       ("http", "421 invalid_host")]


@pytest.mark.anyio
async def test_a_refusal_on_a_dialect_path_leaves_in_that_apis_shape() -> None:
    from meshroute_middleware.chat.dialects import DIALECTS
    from meshroute_middleware.endpoints import DIALECT_PATHS, MESSAGES_PATH

    assert set(DIALECTS) == DIALECT_PATHS  # the guard's paths are the dialects' own

    async def app(scope: object, receive: object, send: object) -> None:
        raise AssertionError("a refused request must not reach the app")

    guard = RequestGuard(app, GuardConfig(), dialects=DIALECTS)  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=guard)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        messages = await c.post(MESSAGES_PATH, json={}, headers={"origin": "http://x.example"})
        chat = await c.post("/v1/chat/completions", json={},
                            headers={"origin": "http://x.example"})
    assert (messages.status_code, chat.status_code) == (403, 403)
    assert messages.json()["type"] == "error"  # Anthropic's {"type": "error", "error": {...}}
    assert messages.json()["error"]["type"] == "permission_error"
    assert chat.json()["error"]["code"] == "origin_not_allowed"  # OpenAI's
