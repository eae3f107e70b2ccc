"""The gossip transport seam and its real implementation: TCP with length-prefixed frames.

Why TCP rather than UDP: a push-pull exchange is request/response, and a digest or delta for a
few hundred routes and origins outgrows one datagram (65,507 bytes at most, ~1,400 without IP
fragmentation); TCP gives us framing, delivery and a connection-refused signal for dead peers.
One exchange is one connection: a request frame, a reply frame, close (at one round a second
per peer the handshake costs nothing that matters).

Inbound connections are cheap to open and must not starve real peers: each must deliver its whole
request frame within `handshake_timeout_s` of being accepted, else it is dropped (counted as
`idle`); at most `max_pending` connections may be waiting for their frame at once, and a new one
past that drops the oldest waiting one. Only a connection that delivered a frame takes one of the
`MAX_CONNECTIONS` handler slots, so idle sockets never hold a slot a real peer needs.
"""

from __future__ import annotations

import logging
import socket
import struct
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Protocol

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from meshroute_middleware.core.logsafe import shown

from . import errors as err
from .wire import MAX_FRAME_BYTES

log = logging.getLogger(__name__)

Address = tuple[str, int]
# Called with one request frame and the sender's address; returns the reply, or None to hang up.
Handler = Callable[[bytes, Address], Awaitable[bytes | None]]
ErrorSink = Callable[[err.GossipError], None]

_LENGTH = struct.Struct(">I")  # 4-byte big-endian frame length
IO_TIMEOUT_S = 5.0  # writing our reply to a peer slower than this is given up
HANDSHAKE_TIMEOUT_S = 2.0  # an inbound frame must arrive whole this soon after accept (slowloris)
MAX_PENDING = 128  # inbound connections waiting for their frame; past it the oldest is dropped
MAX_CONNECTIONS = 64  # concurrent inbound handlers; more wait (fanout 3 x peers is far less)


class Transport(Protocol):
    """Request/response between gossip peers."""

    async def request(self, peer: Address, payload: bytes, timeout_s: float) -> bytes:
        """Send one frame and return the reply; raise PeerTimeout / PeerUnreachable."""
        ...

    async def serve(self, handler: Handler, *,
                    task_status: anyio.abc.TaskStatus[Address] = anyio.TASK_STATUS_IGNORED,
                    ) -> None:
        """Answer requests until cancelled; report the bound address through task_status."""
        ...


async def write_frame(stream: anyio.abc.ByteSendStream, payload: bytes) -> None:
    """Send one length-prefixed frame."""
    await stream.send(_LENGTH.pack(len(payload)) + payload)


async def read_frame(reader: BufferedByteReceiveStream, max_bytes: int) -> bytes:
    """Read one length-prefixed frame; OversizedMessage before reading an oversized body."""
    (length,) = _LENGTH.unpack(await reader.receive_exactly(_LENGTH.size))
    if length > max_bytes:
        raise err.OversizedMessage(f"frame of {length} bytes > {max_bytes}")
    return await reader.receive_exactly(length)


class TcpTransport:
    """Gossip over TCP on `host:port` (port 0 picks a free one)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *,
                 max_frame_bytes: int = MAX_FRAME_BYTES, io_timeout_s: float = IO_TIMEOUT_S,
                 handshake_timeout_s: float = HANDSHAKE_TIMEOUT_S,
                 max_pending: int = MAX_PENDING, on_error: ErrorSink | None = None) -> None:
        self.host, self.port = host, port
        self.max_frame_bytes = max_frame_bytes
        self.io_timeout_s = io_timeout_s
        self.handshake_timeout_s = handshake_timeout_s
        self.max_pending = max_pending
        self.on_error = on_error
        self._limiter = anyio.CapacityLimiter(MAX_CONNECTIONS)
        self._pending: OrderedDict[object, anyio.CancelScope] = OrderedDict()

    async def request(self, peer: Address, payload: bytes, timeout_s: float) -> bytes:
        """One exchange on a fresh connection."""
        try:
            with anyio.fail_after(timeout_s):
                async with await anyio.connect_tcp(*peer) as stream:
                    await write_frame(stream, payload)
                    return await read_frame(BufferedByteReceiveStream(stream),
                                            self.max_frame_bytes)
        except TimeoutError as exc:
            raise err.PeerTimeout(f"{_fmt(peer)} did not answer in {timeout_s:g} s") from exc
        except (OSError, anyio.EndOfStream, anyio.IncompleteRead,
                anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            raise err.PeerUnreachable(f"{_fmt(peer)}: {type(exc).__name__} {exc}") from exc

    async def serve(self, handler: Handler, *,
                    task_status: anyio.abc.TaskStatus[Address] = anyio.TASK_STATUS_IGNORED,
                    ) -> None:
        """Listen and answer until cancelled.

        Accepts by waiting for the socket to be readable, then a non-blocking accept, rather
        than with anyio's listener: that one awaits asyncio's `sock_accept`, which on the
        Pythons we support raises InvalidStateError in the event loop (and drops the
        connection) when it is cancelled while a peer's connection is pending (CPython
        gh-153761), as every shutdown while peers gossip risks."""
        family, *_, address = (await anyio.getaddrinfo(
            self.host, self.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE))[0]
        with socket.create_server(address[:2], family=family) as sock:
            sock.setblocking(False)
            bound = sock.getsockname()
            self.port = int(bound[1])
            task_status.started((str(bound[0]), self.port))
            async with anyio.create_task_group() as tg:
                while True:
                    await anyio.wait_readable(sock)
                    try:
                        conn, _ = sock.accept()
                    except (BlockingIOError, InterruptedError):
                        continue  # another wake-up took it, or a signal
                    except OSError as exc:  # out of file descriptors, say: wait, go on
                        log.warning("gossip: cannot accept a connection: %s", exc)
                        await anyio.sleep(0.1)
                        continue
                    tg.start_soon(self._connection, conn, handler)

    async def _connection(self, conn: socket.socket, handler: Handler) -> None:
        try:
            stream = await anyio.abc.SocketStream.from_socket(conn)
        except OSError as exc:  # the peer left between accept and now
            conn.close()
            self._report(err.PeerUnreachable(f"{type(exc).__name__} {exc}"), ("?", 0))
            return
        async with stream:
            await self._answer(stream, handler)

    async def _receive(self, stream: anyio.abc.SocketStream) -> bytes | None:
        """The request frame, read within the handshake timeout; None if this connection was
        dropped to make room for a newer one."""
        token = object()
        with anyio.CancelScope() as scope:
            while len(self._pending) >= self.max_pending:
                _, oldest = self._pending.popitem(last=False)
                oldest.cancel()
            self._pending[token] = scope
            try:
                with anyio.fail_after(self.handshake_timeout_s):
                    return await read_frame(BufferedByteReceiveStream(stream),
                                            self.max_frame_bytes)
            except TimeoutError as exc:
                raise err.IdleConnection(f"no whole frame within "
                                         f"{self.handshake_timeout_s:g} s") from exc
            finally:
                self._pending.pop(token, None)
        return None

    async def _answer(self, stream: anyio.abc.SocketStream, handler: Handler) -> None:
        remote = stream.extra(anyio.abc.SocketAttribute.remote_address)
        sender: Address = (str(remote[0]), int(remote[1]))
        try:
            frame = await self._receive(stream)
            if frame is None:
                raise err.IdleConnection("dropped while waiting: too many connections waiting")
            async with self._limiter:
                reply = await handler(frame, sender)
                if reply is not None:
                    with anyio.fail_after(self.io_timeout_s):
                        await write_frame(stream, reply)
        except err.GossipError as exc:
            self._report(exc, sender)
        except (TimeoutError, OSError, anyio.EndOfStream, anyio.IncompleteRead,
                anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
            self._report(err.PeerUnreachable(f"{type(exc).__name__} {exc}"), sender)
        except Exception:  # a bug in the handler must not take the listener down
            log.exception("gossip: handler failed for %s", _fmt(sender))

    def _report(self, exc: err.GossipError, sender: Address) -> None:
        log.debug("gossip: inbound from %s refused: %s", _fmt(sender), shown(exc))
        if self.on_error is not None:
            self.on_error(exc)


def _fmt(address: Address) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
