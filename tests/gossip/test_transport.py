"""One suite for both transports (TCP on loopback, in-memory), plus what only each one does."""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from gossip import errors as err
from gossip.memory import MemoryNetwork
from gossip.transport import Address, Handler, TcpTransport, Transport

pytestmark = pytest.mark.anyio
KINDS = ["tcp", "memory"]


async def echo(payload: bytes, sender: Address) -> bytes:
    return b"re:" + payload


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@asynccontextmanager
async def pair(kind: str, handler: Handler, **net: Any) -> AsyncIterator[
        tuple[Transport, Address, Address]]:
    """A client transport, a served address and an address where nothing listens."""
    server: Transport
    client: Transport
    async with anyio.create_task_group() as tg:
        if kind == "tcp":
            server, client = TcpTransport("127.0.0.1", 0), TcpTransport()
            dead: Address = ("127.0.0.1", free_port())
        else:
            network = MemoryNetwork(7, **net)
            server, client = network.transport(("s", 1)), network.transport(("c", 1))
            dead = ("nobody", 1)
        address = await tg.start(server.serve, handler)
        yield client, address, dead
        tg.cancel_scope.cancel()


@pytest.mark.parametrize("kind", KINDS)
async def test_request_gets_the_reply(kind: str) -> None:
    async with pair(kind, echo) as (client, address, _):
        assert await client.request(address, b"hello", 1.0) == b"re:hello"
        big = bytes(range(256)) * 1000
        assert await client.request(address, big, 1.0) == b"re:" + big


@pytest.mark.parametrize("kind", KINDS)
async def test_concurrent_requests_are_answered_independently(kind: str) -> None:
    replies: dict[int, bytes] = {}
    async with pair(kind, echo) as (client, address, _):

        async def one(i: int) -> None:
            replies[i] = await client.request(address, str(i).encode(), 2.0)

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(one, i)
    assert replies == {i: b"re:" + str(i).encode() for i in range(20)}


@pytest.mark.parametrize("kind", KINDS)
async def test_nobody_listening_is_unreachable(kind: str) -> None:
    async with pair(kind, echo) as (client, _, dead):
        with pytest.raises(err.PeerUnreachable):
            await client.request(dead, b"x", 1.0)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_hang_up_is_unreachable(kind: str) -> None:
    async def silent(payload: bytes, sender: Address) -> bytes | None:
        return None

    async with pair(kind, silent) as (client, address, _):
        with pytest.raises(err.PeerUnreachable):
            await client.request(address, b"x", 1.0)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_slow_peer_times_out_within_the_timeout(kind: str) -> None:
    async def slow(payload: bytes, sender: Address) -> bytes:
        await anyio.sleep(5)
        return payload

    async with pair(kind, slow) as (client, address, _):
        start = anyio.current_time()
        with pytest.raises(err.PeerTimeout):
            await client.request(address, b"x", 0.2)
        assert anyio.current_time() - start < 1.0


@pytest.mark.parametrize("kind", KINDS)
async def test_a_failing_handler_hangs_up_and_the_server_keeps_serving(kind: str) -> None:
    async def flaky(payload: bytes, sender: Address) -> bytes:
        if payload == b"boom":
            raise RuntimeError("handler bug")
        return payload

    async with pair(kind, flaky) as (client, address, _):
        with pytest.raises(err.PeerUnreachable):
            await client.request(address, b"boom", 1.0)
        assert await client.request(address, b"ok", 1.0) == b"ok"


# -- in-memory faults ---------------------------------------------------------------------------

async def test_memory_drop_is_a_timeout_and_counted() -> None:
    network = MemoryNetwork(0, drop_rate=1.0)
    async with anyio.create_task_group() as tg:
        address = await tg.start(network.transport(("s", 1)).serve, echo)
        with pytest.raises(err.PeerTimeout):
            await network.transport(("c", 1)).request(address, b"x", 1.0)
        tg.cancel_scope.cancel()
    assert (network.counters.messages, network.counters.dropped) == (1, 1)


async def test_memory_loss_rate_matches_within_tolerance() -> None:
    """20 % per message, two messages per exchange: 64 % succeed; 1000 exchanges, ±5 %."""
    network = MemoryNetwork(3, drop_rate=0.2)
    ok = 0
    async with anyio.create_task_group() as tg:
        address = await tg.start(network.transport(("s", 1)).serve, echo)
        client = network.transport(("c", 1))
        for _ in range(1000):
            try:
                await client.request(address, b"x", 1.0)
                ok += 1
            except err.PeerTimeout:
                pass
        tg.cancel_scope.cancel()
    assert abs(ok / 1000 - 0.64) < 0.05


async def test_memory_duplicates_reach_the_handler_twice() -> None:
    seen: list[bytes] = []

    async def record(payload: bytes, sender: Address) -> bytes:
        seen.append(payload)
        return payload

    async with pair("memory", record, duplicate_rate=1.0) as (client, address, _):
        assert await client.request(address, b"x", 1.0) == b"x"
    assert seen == [b"x", b"x"]


async def test_memory_partition_and_heal() -> None:
    network = MemoryNetwork(1)
    async with anyio.create_task_group() as tg:
        a = await tg.start(network.transport(("a", 1)).serve, echo)
        b_client = network.transport(("b", 1))
        network.partition([("a", 1)], [("b", 1)])
        with pytest.raises(err.PeerTimeout):
            await b_client.request(a, b"x", 1.0)
        network.heal()
        assert await b_client.request(a, b"x", 1.0) == b"re:x"
        tg.cancel_scope.cancel()


async def test_memory_delay_is_applied() -> None:
    async with pair("memory", echo, delay_s=(0.05, 0.05)) as (client, address, _):
        start = anyio.current_time()
        await client.request(address, b"x", 1.0)
        assert anyio.current_time() - start >= 0.1  # request and reply each delayed


# -- TCP only: hostile framing -----------------------------------------------------------------

async def test_tcp_refuses_an_oversized_frame_without_reading_it() -> None:
    refused: list[str] = []
    server = TcpTransport("127.0.0.1", 0, max_frame_bytes=1024,
                          on_error=lambda e: refused.append(e.reason))
    async with anyio.create_task_group() as tg:
        host, port = await tg.start(server.serve, echo)
        async with await anyio.connect_tcp(host, port) as stream:
            await stream.send(struct.pack(">I", 2**31) + b"xx")
            with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError, OSError)):
                await stream.receive()
        client = TcpTransport()
        assert await client.request((host, port), b"still up", 1.0) == b"re:still up"
        tg.cancel_scope.cancel()
    assert refused == ["oversized"]


async def test_tcp_cuts_off_a_peer_that_never_finishes_its_frame() -> None:
    refused: list[str] = []
    server = TcpTransport("127.0.0.1", 0, handshake_timeout_s=0.2,
                          on_error=lambda e: refused.append(e.reason))
    async with anyio.create_task_group() as tg:
        host, port = await tg.start(server.serve, echo)
        async with await anyio.connect_tcp(host, port) as stream:
            await stream.send(struct.pack(">I", 100) + b"only part")
            with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError, OSError)):
                with anyio.fail_after(2):
                    await stream.receive()
        tg.cancel_scope.cancel()
    assert refused == ["idle"]
