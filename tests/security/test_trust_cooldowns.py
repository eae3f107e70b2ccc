"""Issue 22, item 3: `POST /v1/cooldowns/clear` without an admin token is for loopback
clients only, its body is bounded and timed like a chat body, and only an empty body or a
JSON object clears."""

from __future__ import annotations

import socket
import time
from dataclasses import replace
from typing import Any

import httpx
import pytest

from meshroute_middleware.app.config import GatewayConfig
from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core.providers.config import parse_providers_config

from ..providers.fake_provider import FakeProvider
from ..providers.gateway import ENV, gateway, providers_doc

CLEAR = "/v1/cooldowns/clear"


@pytest.fixture
def doc() -> dict[str, Any]:
    fast, slow = FakeProvider("fast"), FakeProvider("slow", models=("small-model",))
    fast.base_url, slow.base_url = "http://127.0.0.1:9/v1", "http://127.0.0.1:9/v1"
    return providers_doc(fast, slow)


def in_process(doc: dict[str, Any], **settings: Any) -> Any:
    base = replace(ServeSettings(mdns=False, state_file=":memory:",
                                 providers=parse_providers_config(doc)), **settings)
    return build_gateway(GatewayConfig.build(base, ENV))


@pytest.mark.anyio
@pytest.mark.parametrize(("client", "token", "status", "code"), [
    ("192.0.2.7", None, 401, "unauthorized"),  # was 200: anyone could clear
    ("127.0.0.1", None, 200, None),
    ("::1", None, 200, None),
    ("192.0.2.7", "adm", 200, None),
    ("127.0.0.1", "wrong", 401, "invalid_token"),
])
async def test_without_an_admin_token_only_loopback_clients_clear(
        doc: dict[str, Any], client: str, token: str | None, status: int,
        code: str | None) -> None:
    gw = in_process(doc, admin_token="adm" if token else None)
    headers = {"authorization": f"Bearer {token}"} if token else {}
    transport = httpx.ASGITransport(app=gw.app, client=(client, 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        resp = await c.post(CLEAR, headers=headers)
    assert resp.status_code == status
    if code is not None:
        assert resp.json()["error"]["code"] == code
    else:
        assert resp.json() == {"cleared": 0, "route": None}


@pytest.mark.anyio
@pytest.mark.parametrize(("body", "status"), [
    (b"", 200), (b"{}", 200), (b'{"route": "fastco/big-model"}', 200),
    (b"   ", 400),  # whitespace cleared everything before
    (b"\n", 400), (b"[]", 400), (b"null", 400), (b'"all"', 400), (b"0", 400),
    (b'{"route": 1}', 400), (b"{", 400), (b"\xff\xfe", 400),
])
async def test_only_an_empty_body_or_a_json_object_clears(
        doc: dict[str, Any], body: bytes, status: int) -> None:
    gw = in_process(doc)
    transport = httpx.ASGITransport(app=gw.app, client=("127.0.0.1", 40000))
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
        resp = await c.post(CLEAR, content=body, headers={"content-type": "application/json"})
    assert resp.status_code == status, resp.text
    if status == 400:
        assert resp.json()["error"]["code"] in ("invalid_json", "invalid_request")


def _head(port: int, extra: str) -> bytes:
    return (f"POST {CLEAR} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\n"
            f"content-type: application/json\r\n{extra}\r\n").encode()


def _status(sock: socket.socket) -> int:
    data = b""
    while b"\r\n" not in data:
        got = sock.recv(4096)
        if not got:
            break
        data += got
    return int(data.split(b" ", 2)[1])


def test_a_huge_chunked_body_is_refused_once_past_the_limit(doc: dict[str, Any]) -> None:
    with gateway(doc, max_body_bytes=1 << 20) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), 30) as sock:
            sock.sendall(_head(port, "transfer-encoding: chunked\r\n"))
            chunk = b"%x\r\n%s\r\n" % (65536, b" " * 65536)
            for _ in range(24):  # 1.5 MiB, then the sender stalls without ending the body
                sock.sendall(chunk)
            sock.settimeout(15)  # before: read on until the body ended (1 GiB: 1 GB of RSS)
            assert _status(sock) == 413


def test_a_slow_body_is_cut_by_the_body_timeout(doc: dict[str, Any]) -> None:
    with gateway(doc, body_timeout_s=0.5) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), 30) as sock:
            sock.sendall(_head(port, "content-length: 100\r\n") + b"{")
            sock.settimeout(15)  # before: open as long as the client kept sending
            start = time.monotonic()
            for _ in range(3):  # a byte now and then, never the whole body
                time.sleep(0.1)
                sock.sendall(b" ")
            assert _status(sock) == 408
            assert time.monotonic() - start < 10  # well before a 1-byte-a-second body ends
