"""Issue 11, item 6 — the HTTP edge has limits, measured against uvicorn with httptools as
`meshroute serve` runs it: an 8 MiB header value and 100,000 header lines got 200 (and were
forwarded), a head or body that never finishes held its connection forever, and half-sent
requests piled up until file descriptors ran out, health probes failed and the healthy node
was evicted. Each refusal is an OpenAI-style JSON error, counted and logged."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

from meshroute_middleware.app.settings import SettingsError, load_settings

from ..chat.test_forward import chat
from ..upstream import FakeChat, ServerThread
from .edge_util import EdgeGateway, raw_request, read_all, status_and_json

HEAD = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n"
        b"content-type: application/json\r\n")


def body_request(extra_headers: bytes = b"") -> bytes:
    body = b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    return (HEAD + extra_headers + b"content-length: " + str(len(body)).encode()
            + b"\r\n\r\n" + body)


def test_an_8_mib_header_value_gets_431_and_is_not_forwarded() -> None:
    head = FakeChat("a")
    with ServerThread(head.app()) as up, EdgeGateway() as gw:
        gw.register("a", up.url)
        raw = raw_request(gw.port, body_request(b"x-big: " + b"a" * (8 << 20) + b"\r\n"))
        status, body = status_and_json(raw)
        assert status == 431 and body["error"]["code"] == "headers_too_large"
        assert head.seen == []
        assert gw.rejected("http") == 1


def test_100000_header_lines_get_431() -> None:
    head = FakeChat("a")
    lines = b"".join(b"x-h%d: v\r\n" % i for i in range(100_000))
    with ServerThread(head.app()) as up, EdgeGateway() as gw:
        gw.register("a", up.url)
        status, body = status_and_json(raw_request(gw.port, body_request(lines)))
        assert status == 431 and body["error"]["type"] == "invalid_request_error"
        assert head.seen == []
        # 101 short lines are too many as well, though far below the byte limit
        few = b"".join(b"x-h%d: v\r\n" % i for i in range(101))
        assert status_and_json(raw_request(gw.port, body_request(few)))[0] == 431
        ok = b"".join(b"x-h%d: v\r\n" % i for i in range(90))
        assert status_and_json(raw_request(gw.port, body_request(ok + b"connection: close\r\n"))
                               )[0] == 200


def test_never_finished_headers_are_cut_off_at_the_limit() -> None:
    """150 MB of a head that never ends: refused once the limit is passed, long before."""
    with EdgeGateway() as gw, socket.create_connection(("127.0.0.1", gw.port), 15) as sock:
        sock.sendall(HEAD)
        sent = 0
        try:
            while sent < 150 << 20:
                sock.sendall(b"x-more: " + b"b" * 8000 + b"\r\n")
                sent += 8010
        except OSError:
            pass
        assert sent < 16 << 20  # the server closed the connection early
        status, _body = status_and_json(read_all(sock))
        assert status == 431


def test_a_slow_head_gets_408() -> None:
    with EdgeGateway(header_timeout_s=0.5) as gw:
        with socket.create_connection(("127.0.0.1", gw.port), 15) as sock:
            sock.sendall(HEAD)  # ... and never the blank line
            status, body = status_and_json(read_all(sock))
        assert status == 408 and body["error"]["code"] == "request_timeout"
        with socket.create_connection(("127.0.0.1", gw.port), 15) as silent:  # no byte at all
            assert status_and_json(read_all(silent))[0] == 408
        assert gw.rejected("http") == 2


def test_a_slow_body_gets_408_and_nothing_is_forwarded() -> None:
    head = FakeChat("a")
    with ServerThread(head.app()) as up, EdgeGateway(body_timeout_s=0.5) as gw:
        gw.register("a", up.url)
        with socket.create_connection(("127.0.0.1", gw.port), 15) as sock:
            sock.sendall(HEAD + b"content-length: 100\r\n\r\n{\"model\":")
            status, body = status_and_json(read_all(sock))
        assert status == 408 and body["error"]["code"] == "request_timeout"
        assert head.seen == []
        assert gw.rejected("http") == 1


def test_a_connection_flood_gets_503_health_checks_go_on_and_chat_works_after() -> None:
    head = FakeChat("a")
    with ServerThread(head.app()) as up, EdgeGateway(max_connections=20, health_interval_s=0.1,
                                                     header_timeout_s=30) as gw:
        assert gw.register("a", up.url).status_code in (200, 201)
        flood = []
        try:
            for _ in range(40):  # half-sent requests: a head that never ends
                sock = socket.create_connection(("127.0.0.1", gw.port), 15)
                sock.sendall(HEAD)
                flood.append(sock)
            refused = []
            for sock in flood[20:]:
                status, body = status_and_json(read_all(sock))
                refused.append((status, body["error"]["code"]))
            assert refused == [(503, "too_many_connections")] * 20
            # during the flood: several health rounds; the healthy node stays
            probes_before = sum(1 for _ in head.seen)
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                assert [n.node_id for n in gw.gateway.router.topology.nodes()] == ["a"]
                time.sleep(0.05)
            assert probes_before == 0  # probes are GETs of /v1/models: no chat was forwarded
        finally:
            for sock in flood:
                sock.close()
        resp = None
        for _ in range(100):  # the flood's sockets close on the server's side shortly after
            resp = httpx.post(gw.url + "/v1/chat/completions", json=chat(), timeout=10)
            if resp.status_code != 503:
                break
            time.sleep(0.05)
        assert resp is not None and resp.status_code == 200, resp.text if resp else None
        assert gw.rejected("http") == 20


def test_edge_settings_have_one_row_each_and_are_checked() -> None:
    settings = load_settings({"max_connections": 10, "max_header_bytes": 4096,
                              "max_headers": 20, "header_timeout_s": 2.5},
                             {"MESHROUTE_REQUEST_TIMEOUT": "90", "MESHROUTE_IDLE_TIMEOUT": "7",
                              "MESHROUTE_BODY_TIMEOUT": "12"})
    limits = settings.edge_limits()
    assert (limits.max_connections, limits.max_header_bytes, limits.max_headers,
            limits.header_timeout_s) == (10, 4096, 20, 2.5)
    assert settings.middleware().request_timeout_s == 90
    assert settings.middleware().body_timeout_s == 12
    assert settings.forward_timeouts().idle_s == 7
    for bad in ({"max_connections": 0}, {"request_timeout_s": 0.0}, {"max_headers": -1}):
        with pytest.raises(SettingsError):
            load_settings(bad)


def test_serve_makes_room_for_max_connections_in_the_descriptor_limit() -> None:
    import resource

    from meshroute_middleware.app.edge import DESCRIPTOR_MARGIN, fit_descriptor_limit
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1024 + DESCRIPTOR_MARGIN:
        pytest.skip("hard descriptor limit too low to test")
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard))
        fit_descriptor_limit(1024)
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 1024 + DESCRIPTOR_MARGIN
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
