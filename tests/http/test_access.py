"""http/access.py: the one loopback rule and the bearer check of the gateway's private APIs."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from meshroute_middleware.http.access import has_bearer, is_loopback_client, peer_of


def request(client: tuple[str, int] | None, authorization: str | None = None) -> Request:
    headers = [] if authorization is None else [(b"authorization", authorization.encode())]
    return Request({"type": "http", "method": "GET", "path": "/", "headers": headers,
                    "client": client})


@pytest.mark.parametrize(("host", "loopback"), [
    ("127.0.0.1", True), ("127.8.9.10", True), ("::1", True), ("::ffff:127.0.0.1", True),
    ("fe80::1%eth0", False), ("10.0.0.1", False), ("::ffff:10.0.0.1", False),
    ("testclient", False), ("", False),
])
def test_loopback_peers(host: str, loopback: bool) -> None:
    assert is_loopback_client(request((host, 1))) is loopback


def test_no_peer_is_not_loopback() -> None:
    assert not is_loopback_client(request(None))
    assert peer_of(request(None)) == "unknown"
    assert peer_of(request(("x" * 100, 1))) == "x" * 64


@pytest.mark.parametrize(("token", "given", "ok"), [
    ("s3cret", "Bearer s3cret", True), ("s3cret", "Bearer s3cre", False),
    ("s3cret", "s3cret", False), ("s3cret", None, False), (None, "Bearer ", False),
    ("", "Bearer ", False),
])
def test_bearer(token: str | None, given: str | None, ok: bool) -> None:
    assert has_bearer(request(("10.0.0.1", 1), given), token) is ok
