"""Issue 22, item 0 — the head limit counts the head only. The official `openai` client
sending a 100 KB message got `431 headers_too_large` from `meshroute serve`: body bytes that
arrived in the same read as the head were counted into the 64 KiB head limit. Any body up to
`--max-body-bytes` must pass however its bytes arrive: one write, many, slow."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import openai
import pytest

from ..upstream import FakeChat, ServerThread, serve_process
from .edge_util import EdgeGateway, read_all, status_and_json

BODY_LIMIT = 1024 * 1024  # --max-body-bytes of these gateways


def chat_body(size: int) -> bytes:
    """A chat request body of exactly `size` bytes (one user message, padded)."""
    frame = json.dumps({"model": "m", "messages": [{"role": "user", "content": ""}]})
    body = frame.replace('"content": ""', '"content": "' + "w" * (size - len(frame)) + '"')
    assert len(body) == size
    return body.encode()


def request(body: bytes, *, close: bool = True) -> bytes:
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n"
            b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
    return head + (b"connection: close\r\n" if close else b"") + b"\r\n" + body


def test_the_official_client_sends_a_long_message_to_meshroute_serve(tmp_path: Path) -> None:
    node = FakeChat("a")
    # one `meshroute serve` for both sizes: a process start is most of this test's time
    with ServerThread(node.app()) as up, serve_process([], tmp_path / "serve.log") as (url, _):
        registered = httpx.post(f"{url}/v1/nodes", json={
            "node_id": "a", "model": "m", "start": 0, "end": 39, "layers": 40, "url": up.url,
            "tps": 10})
        assert registered.status_code in (200, 201), registered.text
        client = openai.OpenAI(base_url=url + "/v1", api_key="sk-test", max_retries=0)
        for kb in (100, 300):
            long_prompt = "lorem ipsum " * (kb * 1000 // 12)  # ~25k tokens at 100 KB
            answer = client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": long_prompt}])
            assert answer.choices[0].message.content
            assert node.seen[-1]["body"]["messages"][0]["content"] == long_prompt
            assert 'meshroute_rejected_total{source="http"}' not in httpx.get(
                url + "/metrics").text


@pytest.mark.parametrize("kib", [1, 60, 64, 65, 80, 100, 128, 130, 200, 512, 1023])
def test_a_body_in_the_same_write_as_its_head_is_not_part_of_the_head(kib: int) -> None:
    node = FakeChat("a")
    with ServerThread(node.app()) as up, EdgeGateway(max_body_bytes=BODY_LIMIT) as gw:
        gw.register("a", up.url)
        with socket.create_connection(("127.0.0.1", gw.port), timeout=15) as sock:
            sock.sendall(request(chat_body(kib * 1024)))  # head and body: one write
            status, body = status_and_json(read_all(sock))
        assert status == 200, body
        assert len(node.seen) == 1


def test_a_body_at_the_limit_passes_in_many_small_slow_writes() -> None:
    node = FakeChat("a")
    with ServerThread(node.app()) as up, EdgeGateway(max_body_bytes=BODY_LIMIT) as gw:
        gw.register("a", up.url)
        data = request(chat_body(BODY_LIMIT))
        with socket.create_connection(("127.0.0.1", gw.port), timeout=15) as sock:
            for i in range(0, len(data), 64 * 1024 - 1):
                sock.sendall(data[i:i + 64 * 1024 - 1])
                time.sleep(0.005)
            status, body = status_and_json(read_all(sock))
        assert status == 200, body


def test_one_byte_over_the_body_limit_is_413_not_431() -> None:
    with EdgeGateway(max_body_bytes=BODY_LIMIT) as gw:
        with socket.create_connection(("127.0.0.1", gw.port), timeout=15) as sock:
            sock.sendall(request(chat_body(BODY_LIMIT + 1)))
            status, body = status_and_json(read_all(sock))
        assert status == 413 and body["error"]["code"] == "request_too_large"


def test_two_pipelined_requests_with_large_bodies_in_one_write() -> None:
    node = FakeChat("a")
    with ServerThread(node.app()) as up, EdgeGateway(max_body_bytes=BODY_LIMIT) as gw:
        gw.register("a", up.url)
        data = (request(chat_body(100 * 1024), close=False)
                + request(chat_body(100 * 1024)))
        with socket.create_connection(("127.0.0.1", gw.port), timeout=15) as sock:
            sock.sendall(data)
            raw = read_all(sock)
        assert raw.count(b"HTTP/1.1 200 OK") == 2, raw[:300]
        assert len(node.seen) == 2


def test_a_head_alone_over_the_limit_is_still_431() -> None:
    """What the head limit is for stays: 70 KB of header in one write with a small body."""
    with EdgeGateway(max_body_bytes=BODY_LIMIT) as gw:
        body = chat_body(100)
        data = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\nx-pad: "
                + b"p" * 70_000 + b"\r\ncontent-length: %d\r\n\r\n" % len(body) + body)
        with socket.create_connection(("127.0.0.1", gw.port), timeout=15) as sock:
            sock.sendall(data)
            status, body_json = status_and_json(read_all(sock))
        assert status == 431 and body_json["error"]["code"] == "headers_too_large"


def test_the_uvicorn_hooks_the_edge_extends_are_there() -> None:
    """app/edge.py extends uvicorn's protocol instead of copying it: a parse error must reach
    `send_400_response`, and the parser callbacks must be the ones it wraps."""
    import inspect

    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

    assert "self.send_400_response(" in inspect.getsource(HttpToolsProtocol.data_received)
    for hook in ("on_message_begin", "on_url", "on_header", "on_headers_complete", "on_body",
                 "on_message_complete", "connection_made", "connection_lost"):
        assert callable(getattr(HttpToolsProtocol, hook)), hook


def test_a_flood_of_malformed_requests_is_refused_in_json_and_logged_sparingly(
        caplog: pytest.LogCaptureFixture) -> None:
    """uvicorn's own parse-error path is reused (send_400_response): the answer is the edge's
    JSON 400, and uvicorn's one-warning-per-request is left to the edge's throttled log."""
    import logging

    uvicorn_lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            uvicorn_lines.append(record.getMessage())

    keep = Keep()
    uvicorn_log = logging.getLogger("uvicorn.error")  # its records do not propagate
    with EdgeGateway() as gw, caplog.at_level(logging.WARNING):
        uvicorn_log.addHandler(keep)  # after uvicorn configured its logging (dictConfig)
        try:
            for _ in range(30):
                with socket.create_connection(("127.0.0.1", gw.port), timeout=15) as sock:
                    sock.sendall(b"GARBAGE / HTTP/1.1\r\n\x00\r\n\r\n")
                    status, body = status_and_json(read_all(sock))
                assert status == 400 and body["error"]["code"] == "invalid_request"
        finally:
            uvicorn_log.removeHandler(keep)
        assert gw.rejected("http") == 30
    assert not any("Invalid HTTP request received" in line for line in uvicorn_lines)
    lines = [r.getMessage() for r in caplog.records]
    assert 1 <= sum("refused a connection" in line for line in lines) <= 10
