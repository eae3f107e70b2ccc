"""AiohttpForwarder against a real head on 127.0.0.1: a pooled keep-alive connection the head
has closed is retried once on a fresh connection, and a genuine head failure stays one."""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace

import httpx
import pytest

from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig
from meshroute_middleware.forwarding.client import AiohttpForwarder, ForwardError, ForwardTimeouts
from tests.conftest import FakeClock

pytestmark = pytest.mark.anyio
BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
ANSWER = json.dumps({"id": "c", "object": "chat.completion", "model": "m",
                     "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"},
                                  "finish_reason": "stop"}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 20,
                               "total_tokens": 21}}).encode()
RESPONSE = (b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: keep-alive\r\n"
            b"content-length: " + str(len(ANSWER)).encode() + b"\r\n\r\n" + ANSWER)

# Whether the head answers request number n (from 1) on connection number c (from 1).
Answers = Callable[[int, int], bool]


@dataclass
class RawHead:
    """An HTTP/1.1 head on a raw socket that advertises keep-alive, then, per `answers`,
    drops a request unanswered: closed (FIN) or, with `reset`, aborted (RST). Dropping the
    second request of a connection is the race a pooled connection loses, made deterministic:
    the head closed it just as the gateway sent a request on it."""

    answers: Answers
    reset: bool = False
    connections: int = 0
    answered: int = 0
    dropped: int = 0
    port: int = 0
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        conn, n = self.connections, 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                n += 1
                if not self.answers(conn, n):
                    self.dropped += 1
                    if self.reset:  # SO_LINGER 0: close sends RST, not FIN
                        sock = writer.get_extra_info("socket")
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                        struct.pack("ii", 1, 0))
                    writer.close()
                    return
                writer.write(RESPONSE)
                await writer.drain()
                self.answered += 1
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1/chat/completions"


@asynccontextmanager
async def raw_head(answers: Answers, reset: bool = False) -> AsyncIterator[RawHead]:
    head = RawHead(answers, reset)
    server = await asyncio.start_server(head.serve, "127.0.0.1", 0)
    head.port = server.sockets[0].getsockname()[1]
    async with server:
        yield head


def first_only(conn: int, n: int) -> bool:
    """Answers the first request of every connection, closes on the second."""
    return n == 1


async def post(forwarder: AiohttpForwarder, head: RawHead) -> bytes:
    upstream = await forwarder.open(head.url, BODY, [(b"content-type", b"application/json")])
    try:
        return b"".join([chunk async for chunk in upstream.chunks()])
    finally:
        upstream.close()


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
async def test_a_stale_pooled_connection_is_retried_once_on_a_fresh_one(reset: bool) -> None:
    forwarder = AiohttpForwarder()
    try:
        async with raw_head(first_only, reset) as head:
            assert await post(forwarder, head) == ANSWER
            assert await post(forwarder, head) == ANSWER  # pooled: dropped, then fresh
            assert (head.connections, head.dropped, head.answered) == (2, 1, 2)
            assert forwarder.stale_retries == 1
    finally:
        await forwarder.aclose()


async def test_the_retry_failing_too_is_the_head_failing() -> None:
    forwarder = AiohttpForwarder()
    try:
        async with raw_head(lambda conn, n: conn == 1 and n == 1) as head:
            await post(forwarder, head)
            with pytest.raises(ForwardError) as caught:
                await post(forwarder, head)
            assert caught.value.kind == "connect"
            assert (head.connections, head.dropped, forwarder.stale_retries) == (2, 2, 1)
    finally:
        await forwarder.aclose()


@pytest.mark.parametrize("reset", [False, True], ids=["closed", "reset"])
async def test_a_fresh_connection_dropped_is_a_failure_not_retried(reset: bool) -> None:
    forwarder = AiohttpForwarder()
    try:
        async with raw_head(lambda conn, n: False, reset) as head:
            with pytest.raises(ForwardError) as caught:
                await post(forwarder, head)
            assert caught.value.kind == "connect"
            assert (head.connections, forwarder.stale_retries) == (1, 0)
    finally:
        await forwarder.aclose()


async def test_a_refused_connection_is_a_failure_not_retried() -> None:
    forwarder = AiohttpForwarder(ForwardTimeouts(connect_s=2.0))
    async with raw_head(first_only) as head:
        url = head.url  # the port closes with the server
    try:
        with pytest.raises(ForwardError) as caught:
            await forwarder.open(url, BODY, [])
        assert caught.value.kind == "connect" and forwarder.stale_retries == 0
    finally:
        await forwarder.aclose()


async def test_the_gateway_records_no_failure_for_a_stale_pooled_connection() -> None:
    """Through the gateway: both requests succeed on the one route, no fallback, no failure."""
    settings = replace(ServeSettings(mdns=False, seed=7), router=RouterConfig(explore_share=0.0))
    forwarder = AiohttpForwarder()
    gateway = build_gateway(settings, forwarder=forwarder, clock=FakeClock())
    try:
        async with raw_head(first_only) as head:
            gateway.mesh.upsert_raw({"node_id": "h", "model": "m", "start": 0, "end": 9,
                                     "layers": 10, "url": f"http://127.0.0.1:{head.port}"},
                                    "test")
            transport = httpx.ASGITransport(app=gateway.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
                for _ in range(2):
                    resp = await client.post("/v1/chat/completions", content=BODY,
                                             headers={"content-type": "application/json"})
                    assert resp.status_code == 200, resp.text
                metrics = (await client.get("/metrics")).text
            assert "\nmeshroute_forward_stale_retries_total 1.0\n" in metrics
            (entry,) = [e for (_, _), origins in gateway.router.stats
                        for e in origins.values()]
            assert (entry.ok, entry.fail, entry.count) == (2.0, 0.0, 2)
            assert forwarder.stale_retries == 1 and head.dropped == 1
    finally:
        await forwarder.aclose()
