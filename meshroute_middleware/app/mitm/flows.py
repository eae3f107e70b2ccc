"""What the addon does to one flow: which flows are chat, the headers a head may see, the
attempt that measures a streamed answer, answering with an error, waiting for a head while
watching the client."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass
from typing import Literal, TypeVar

from mitmproxy import http
from mitmproxy.connection import ConnectionState

from meshroute_middleware.app.mitm.relay import Parked
from meshroute_middleware.chat.attempts import Attempts, Measurement
from meshroute_middleware.chat.headers import OURS
from meshroute_middleware.core import Decision, MeshRouteError, Outcome
from meshroute_middleware.core.contracts.plan import MODE_HEADER, PLAN_HEADER, ROUTE_HEADER
from meshroute_middleware.core.kinds import ErrorKind
from meshroute_middleware.forwarding.measure import TokenMeter
from meshroute_middleware.http.errors import ErrorAnswer
from meshroute_middleware.http.guard import UNSPECIFIED, host_of, is_loopback_host

T = TypeVar("T")
CLIENT_WATCH_S = 0.05  # how often a client is checked while the addon waits for a head
CHAT_PATH = "/v1/chat/completions"
H_ROUTE, H_PLAN, H_MODE = ROUTE_HEADER, PLAN_HEADER, MODE_HEADER
CREDENTIALS = frozenset({"authorization", "cookie", "proxy-authorization", "x-api-key"})
NOT_FORWARDED = CREDENTIALS | {
    "host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade", "te",
    "trailer", "proxy-connection", "accept-encoding", "content-encoding"}


@dataclass(slots=True, eq=False)
class RelayedAnswer:
    """A routed flow whose head answered: measured (chat.attempts' Measurement, clamps and
    all) as it streams, recorded at its end."""

    decision: Decision
    measurement: Measurement
    parked: Parked
    ticket: str
    meter: TokenMeter
    attempts: Attempts  # the request's: it records the outcome
    client_error: bool = False  # a 4xx: the client's own mistake, no sample

    def chunk(self, data: bytes) -> bytes:
        """flow.response.stream: pass the chunk on, noting time and tokens."""
        m = self.measurement
        now = time.perf_counter()
        if data:
            if m.first is None:
                m.first = now
            self.meter.feed(data)
        m.last = now
        return data

    def outcome(self, error: ErrorKind | Literal[""]) -> Outcome:
        """What the router records: tokens over forwarding-to-last-byte, TTFB apart."""
        return self.measurement.outcome(error)


class ClientGone(MeshRouteError):
    """The client closed its connection while the addon waited for a head."""


async def unless_client_leaves(flow: http.HTTPFlow, opening: Awaitable[T]) -> T:
    """Await `opening`, cancelling it (and so the head's request) if the client leaves.

    mitmproxy queues a client's close behind a running hook, so the `error` hook cannot tell
    us in time; the connection's state loses CAN_READ as soon as the client's EOF is read."""
    task = asyncio.ensure_future(opening)
    client = flow.client_conn
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=CLIENT_WATCH_S)
            if done:
                return task.result()
            if not client.state & ConnectionState.CAN_READ:
                raise ClientGone
    finally:
        if not task.done():
            task.cancel()


def is_chat(flow: http.HTTPFlow) -> bool:
    request = flow.request
    return bool(request.method == "POST" and request.path.split("?", 1)[0] == CHAT_PATH)


def is_local(host: str, own: frozenset[str]) -> bool:
    """Whether a flow's destination is this machine: loopback, the unspecified address (which
    connects here), or one of its own names and addresses."""
    host = host_of(host)
    return is_loopback_host(host) or host in UNSPECIFIED or host in own


def forwarded_headers(fields: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The client's headers a head may see: no credentials, hop-by-hop or x-meshroute-*."""
    return [(k, v) for k, v in fields if k.lower().decode("latin-1") not in NOT_FORWARDED
            and not k.lower().startswith(OURS)]


def plan_headers(decision: Decision) -> list[tuple[bytes, bytes]]:
    return [(H_ROUTE.encode(), decision.signature.encode()),
            (H_PLAN.encode(), decision.route.plan_header().encode()),
            (H_MODE.encode(), decision.mode.encode())]


def answer_error(flow: http.HTTPFlow, answer: ErrorAnswer,
                 headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    """Answer the client with an OpenAI-style JSON error instead of forwarding (`headers`:
    any it carries beyond its body, a 429's Retry-After)."""
    flow.response = http.Response.make(answer.status, answer.body(),
                                       [(b"content-type", b"application/json"), *headers])
