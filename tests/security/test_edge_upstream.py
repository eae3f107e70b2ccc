"""Issue 11, item 6 — what a head sends back: a head that drips a byte now and then cannot
hold a request forever (idle timeout, total deadline), a truncated answer is never passed
off as complete, and a compressed answer keeps its content-encoding."""

from __future__ import annotations

import gzip
import json
import socket
import time

import httpx
import pytest

from meshroute_middleware.chat import relay

from ..chat.test_forward import chat
from .edge_util import EdgeGateway, RawNode, completion

SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n")
JSON_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
             b"transfer-encoding: chunked\r\n\r\n")


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def token(i: int) -> bytes:
    return chunk(b'data: {"choices":[{"delta":{"content":"t%d "}}]}\n\n' % i)


def dripper(every_s: float, count: int, streaming: bool = True) -> RawNode:
    """A head that sends one piece every `every_s`, `count` times, then ends cleanly."""
    def script(sock: socket.socket, head: bytes) -> None:
        sock.sendall(SSE_HEAD if streaming else JSON_HEAD)
        body = completion(count)
        for i in range(count):
            sock.sendall(token(i) if streaming else chunk(body[i::count][:1] or b" "))
            time.sleep(every_s)
        sock.sendall(chunk(b"data: [DONE]\n\n") if streaming else b"")
        sock.sendall(b"0\r\n\r\n")
    return RawNode(script)


def test_a_head_silent_between_chunks_past_the_idle_timeout_ends_the_stream() -> None:
    """Bytes every 0.6 s against an idle timeout of 0.2 s (59 s against 30 s, scaled)."""
    with dripper(0.6, 10) as slow, EdgeGateway(idle_timeout_s=0.2) as gw:
        gw.register("slow", slow.url)
        started = time.monotonic()
        resp = httpx.post(gw.url + "/v1/chat/completions", json=chat(stream=True), timeout=30)
        assert time.monotonic() - started < 5.5  # the whole drip would take 6 s
        events = [line for line in resp.text.splitlines() if line.startswith("data: {")]
        last = json.loads(events[-1][6:])
        assert last["error"]["code"] == "upstream_failed"
        assert "[DONE]" not in resp.text
        [outcome] = gw.outcomes()
        assert outcome["ok"] is False


def prefiller(prefill_s: float, count: int) -> RawNode:
    """A head that sends its headers at once and its first chunk after `prefill_s` (as
    llama.cpp's server does while it prefills the prompt), then `count` tokens."""
    def script(sock: socket.socket, head: bytes) -> None:
        sock.sendall(SSE_HEAD)
        time.sleep(prefill_s)
        for i in range(count):
            sock.sendall(token(i))
        sock.sendall(chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    return RawNode(script)


def test_the_wait_for_the_first_chunk_after_early_headers_is_the_first_bytes() -> None:
    """Headers at once, the first chunk 1 s later (a prefill) against an idle timeout of
    0.2 s: the answer is whole; the first-byte timeout (5 s) bounds that wait."""
    with prefiller(1.0, 5) as node, EdgeGateway(idle_timeout_s=0.2) as gw:
        gw.register("prefill", node.url)
        resp = httpx.post(gw.url + "/v1/chat/completions", json=chat(stream=True), timeout=30)
        assert resp.status_code == 200
        assert "[DONE]" in resp.text and '"error"' not in resp.text
        assert [o["ok"] for o in gw.outcomes()] == [True]
    with prefiller(3.0, 5) as node, EdgeGateway(idle_timeout_s=0.2,
                                                first_byte_timeout_s=1.0) as gw:
        gw.register("prefill", node.url)
        started = time.monotonic()
        resp = httpx.post(gw.url + "/v1/chat/completions", json=chat(stream=True), timeout=30)
        assert time.monotonic() - started < 2.9  # cut at the first-byte timeout
        assert "[DONE]" not in resp.text
        assert [o["ok"] for o in gw.outcomes()] == [False]


def test_a_json_answer_that_goes_silent_is_cut_off_not_completed() -> None:
    """A non-stream answer dripping past the idle timeout: the client's connection is
    aborted (no clean 200 with part of a body) and the attempt is a failure."""
    with dripper(0.6, 10, streaming=False) as slow, EdgeGateway(idle_timeout_s=0.2) as gw:
        gw.register("slow", slow.url)
        with pytest.raises(httpx.TransportError):
            httpx.post(gw.url + "/v1/chat/completions", json=chat(), timeout=30)
        [outcome] = gw.outcomes()
        assert outcome["ok"] is False and outcome["error"] == "stream"


def test_the_total_request_deadline_ends_a_stream_that_keeps_dripping() -> None:
    """Bytes every 0.1 s (never idle for long) for 8 s against a 1 s deadline."""
    with dripper(0.1, 80) as slow, EdgeGateway(request_timeout_s=1.0) as gw:
        gw.register("slow", slow.url)
        started = time.monotonic()
        resp = httpx.post(gw.url + "/v1/chat/completions", json=chat(stream=True), timeout=30)
        assert time.monotonic() - started < 7.0
        last = [line for line in resp.text.splitlines() if line.startswith("data: {")][-1]
        assert json.loads(last[6:])["error"]["message"].startswith(relay.STALLED_TEXT)
        [outcome] = gw.outcomes()
        assert outcome["ok"] is False and outcome["error"] == "timeout"


def test_the_deadline_before_any_byte_is_a_504_json_error() -> None:
    def silent(sock: socket.socket, head: bytes) -> None:
        time.sleep(8)

    with RawNode(silent) as mute, EdgeGateway(request_timeout_s=0.5,
                                              first_byte_timeout_s=10) as gw:
        gw.register("mute", mute.url)
        resp = httpx.post(gw.url + "/v1/chat/completions", json=chat(), timeout=30)
        assert resp.status_code == 504, resp.text
        assert resp.json()["error"]["code"] == "request_timeout"
        assert resp.headers["x-meshroute-route"] == "m|mute[0-39]"
        [outcome] = gw.outcomes()
        assert outcome["ok"] is False and outcome["error"] == "timeout"


@pytest.mark.parametrize("framing", ["chunked", "content-length"])
def test_a_truncated_json_answer_aborts_the_clients_connection(framing: str) -> None:
    body = completion(20)
    half = body[: len(body) // 2]

    def cut(sock: socket.socket, head: bytes) -> None:
        if framing == "chunked":
            sock.sendall(JSON_HEAD + chunk(half))
        else:
            sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                         b"content-length: %d\r\n\r\n%s" % (len(body), half))
        sock.shutdown(socket.SHUT_RDWR)

    with RawNode(cut) as broken, EdgeGateway() as gw:
        gw.register("broken", broken.url)
        with pytest.raises(httpx.TransportError):  # never a clean 200 with half a body
            httpx.post(gw.url + "/v1/chat/completions", json=chat(), timeout=10)
        [outcome] = gw.outcomes()
        assert outcome["ok"] is False and outcome["error"] == "stream"


def test_a_truncated_stream_ends_with_an_error_event() -> None:
    def cut(sock: socket.socket, head: bytes) -> None:
        sock.sendall(SSE_HEAD + token(0) + token(1))
        sock.shutdown(socket.SHUT_RDWR)

    with RawNode(cut) as broken, EdgeGateway() as gw:
        gw.register("broken", broken.url)
        resp = httpx.post(gw.url + "/v1/chat/completions", json=chat(stream=True), timeout=10)
        last = [line for line in resp.text.splitlines() if line.startswith("data: {")][-1]
        assert json.loads(last[6:])["error"]["code"] == "upstream_failed"
        assert gw.outcomes()[-1]["ok"] is False


def test_a_gzip_answer_keeps_its_content_encoding() -> None:
    """The forwarder asks for identity; a head that compresses anyway is relayed with its
    header, so the client can read what it got."""
    packed = gzip.compress(completion(20))

    def squeeze(sock: socket.socket, head: bytes) -> None:
        assert b"accept-encoding: identity" in head.lower()
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                     b"content-encoding: gzip\r\ncontent-length: %d\r\n\r\n%s"
                     % (len(packed), packed))

    with RawNode(squeeze) as zipper, EdgeGateway() as gw:
        gw.register("zip", zipper.url)
        resp = httpx.post(gw.url + "/v1/chat/completions", json=chat(), timeout=10,
                          headers={"accept-encoding": "gzip"})
        assert resp.status_code == 200
        assert resp.headers["content-encoding"] == "gzip"
        assert resp.json()["usage"]["completion_tokens"] == 20
