"""The relay: an upstream answer the addon opened, handed to mitmproxy to stream to its client.

mitmproxy can stream a body only from a server connection of its own; an addon can replace a
response, but only with a whole body. So the addon opens the route head's response itself (the
gateway's Forwarder, fallback included, up to the status line) and parks it here under a
one-time ticket; the flow is pointed at this relay on the side server, which streams the parked
body chunk by chunk. Loopback only; a ticket is 128 random bits, used once, and dropped after
TICKET_TTL_S if mitmproxy never comes for it.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
from dataclasses import dataclass
from typing import Literal

from starlette.types import Receive, Scope, Send

from meshroute_middleware.chat.headers import node_headers
from meshroute_middleware.chat.relay import broken_text, relay
from meshroute_middleware.core.kinds import ErrorKind
from meshroute_middleware.forwarding.client import UpstreamResponse
from meshroute_middleware.forwarding.measure import sse_error_event
from meshroute_middleware.http.errors import HttpError

log = logging.getLogger("meshroute.mitm")
RELAY_PATH = "/meshroute/relay"
TICKET_HEADER = b"x-meshroute-ticket"
TICKET_TTL_S = 30.0  # mitmproxy connects to the relay within milliseconds of the request hook


@dataclass(slots=True, eq=False)
class Parked:
    """An opened upstream response waiting for (then being streamed to) mitmproxy."""

    upstream: UpstreamResponse
    streaming: bool
    error: ErrorKind | Literal[""] = ""  # "stream" when the head failed mid-body
    fetched: bool = False  # mitmproxy came for it
    deadline: float = float("inf")  # the request's deadline (a loop time): cut there
    expiry: asyncio.TimerHandle | None = None

    def close(self) -> None:
        """Release (or abort) the upstream request; idempotent."""
        if self.expiry is not None:
            self.expiry.cancel()
            self.expiry = None
        self.upstream.close()


class Relay:
    """Tickets -> parked upstream answers, and the ASGI endpoint that streams them."""

    def __init__(self) -> None:
        self._parked: dict[str, Parked] = {}

    def __len__(self) -> int:
        return len(self._parked)

    def park(self, parked: Parked) -> str:
        """Park an opened answer; return its ticket."""
        ticket = secrets.token_urlsafe(16)
        self._parked[ticket] = parked
        parked.expiry = asyncio.get_running_loop().call_later(
            TICKET_TTL_S, self._expire, ticket)
        return ticket

    def discard(self, ticket: str) -> None:
        """Close a parked answer nobody will fetch (the client left)."""
        parked = self._parked.pop(ticket, None)
        if parked is not None:
            parked.close()

    def _expire(self, ticket: str) -> None:
        if ticket in self._parked:
            log.warning("meshroute: relay ticket expired unfetched; upstream closed")
            self.discard(ticket)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        ticket = next((v.decode("latin-1") for k, v in scope.get("headers", ())
                       if k == TICKET_HEADER), "")
        parked = self._parked.pop(ticket, None)
        if parked is None:
            await HttpError.INVALID_TICKET.send(send, "unknown or used relay ticket")
            return
        parked.fetched = True
        if parked.expiry is not None:
            parked.expiry.cancel()
            parked.expiry = None
        watcher = asyncio.ensure_future(_closed_by_client(receive, parked))
        try:
            await self._stream(parked, send)
        except OSError:
            pass  # mitmproxy dropped the connection: its client left
        finally:
            watcher.cancel()
            parked.close()

    @staticmethod
    async def _stream(parked: Parked, send: Send) -> None:
        up = parked.upstream
        await send({"type": "http.response.start", "status": up.status,  # as the gateway's
                    "headers": node_headers(up.headers)})
        parked.error = await relay(send, up.chunks(), parked.deadline)
        tail = b""
        if parked.error and parked.streaming:
            tail = sse_error_event(broken_text(parked.error))
        await send({"type": "http.response.body", "body": tail, "more_body": False})


async def _closed_by_client(receive: Receive, parked: Parked) -> None:
    """mitmproxy closed the relay request (its client left): abort the upstream request."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            parked.close()
            return
