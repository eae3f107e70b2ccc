"""Issue 22, item 7 — `x-session-id` had no length cap: 3,000 requests with 60 KB ids added
172 MB of RSS in 5 s, and up to 10,000 were kept for an hour. An id is at most 128 bytes
(longer: 400), and the session map is bounded in bytes."""

from __future__ import annotations

import httpx

from meshroute_middleware.core.providers.chain import MAX_SESSION_ID_BYTES, Sessions

from ..upstream import FakeChat, ServerThread
from .edge_util import EdgeGateway

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def test_an_id_over_128_bytes_gets_400_and_128_passes() -> None:
    head = FakeChat("a")
    with ServerThread(head.app()) as up, EdgeGateway() as gw:
        gw.register("a", up.url)
        long = httpx.post(f"{gw.url}/v1/chat/completions", json=BODY,
                          headers={"x-session-id": "s" * 129})
        assert long.status_code == 400
        error = long.json()["error"]
        assert error["code"] == "invalid_session_id"
        assert error["type"] == "invalid_request_error" and "128" in error["message"]
        assert head.seen == []
        assert gw.rejected("http") == 1
        huge = httpx.post(f"{gw.url}/v1/chat/completions", json=BODY,
                          headers={"x-session-id": "s" * 60_000})
        assert huge.status_code == 400
        fits = httpx.post(f"{gw.url}/v1/chat/completions", json=BODY,
                          headers={"x-session-id": "s" * MAX_SESSION_ID_BYTES})
        assert fits.status_code == 200


def test_the_session_map_is_bounded_in_bytes() -> None:
    sessions = Sessions(max_entries=1_000_000, max_bytes=10_000)
    for i in range(5_000):
        sessions.served(f"{i:0>120}", "fastco/big-model", float(i))
        assert sessions.bytes <= 10_000
    assert 0 < len(sessions) <= 10_000 // 120
    newest = f"{4_999:0>120}"
    assert sessions.get(newest, 5_000.0) == "fastco/big-model"  # the oldest went first
    assert sessions.get(f"{0:0>120}", 5_000.0) is None


def test_the_byte_count_follows_refreshes_expiry_and_forgetting() -> None:
    sessions = Sessions(ttl_s=10.0)
    sessions.served("abc", "p/m", 0.0)
    sessions.served("abc", "p/longer-route", 1.0)  # a refresh replaces, never adds
    assert sessions.bytes == len("abc") + len("p/longer-route")
    assert sessions.get("abc", 100.0) is None  # expired
    assert sessions.bytes == 0 and len(sessions) == 0
    sessions.served("x" * (MAX_SESSION_ID_BYTES + 1), "p/m", 0.0)  # never held
    assert len(sessions) == 0 and sessions.bytes == 0
