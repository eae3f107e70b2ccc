"""Forwarding a chat request to a route's head over HTTP (aiohttp, chosen by measurement).

The transport seam: `Forwarder` opens an upstream response whose body can be relayed chunk by
chunk. Failures before the first byte are raised as ForwardError with a kind the router records.

The forwarder never follows a redirect (a head answering 3xx is a failed attempt: following it
would let a node point the gateway at any URL it likes), asks for an identity encoding and keeps
`content-encoding` if a head compresses anyway (the bytes are relayed as they came, so the
header must stay with them), and gives up on a head that stays silent between two chunks for
longer than `ForwardTimeouts.idle_s`. Until the body's first byte the first-byte timeout holds:
a streaming server may send its headers at once and its first chunk only after the prompt's
prefill (llama.cpp's server does: 28 s for a cold 1,200-token prompt on a loaded 2-core
machine), and that wait is the first byte's, not a stall mid-answer.

A pooled keep-alive connection the head closed while idle can be handed out just as the close
is under way: the request then fails before a byte of answer (`ServerDisconnectedError`,
"Can not write request body"). aiohttp retries that only for idempotent methods, never a POST;
the forwarder retries it once on a fresh connection to the same head, and only when aiohttp
reports the connection as reused (`on_connection_reuseconn`): a fresh connection that fails is
the head failing, as is the retry failing.
"""

from __future__ import annotations

import traceback
import weakref
from collections.abc import AsyncIterator, Iterable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Protocol

import aiohttp
from prometheus_client.core import CounterMetricFamily, Metric

from meshroute_middleware.core.errors import MeshRouteError
from meshroute_middleware.core.kinds import ErrorKind
from meshroute_middleware.telemetry.events import TAP

# Response headers a head's answer loses on its way (chat.headers drops the rest: cookies,
# the head's own date/server). content-length is re-added from the parsed value.
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade", b"host", b"content-length",
    b"accept-encoding", b"proxy-connection",
})
_ERROR_BODY_LIMIT = 64 * 1024
_CONNECTION_CLOSED = "Connection closed."  # aiohttp's RuntimeError (streams.py `_wait`)


@dataclass(frozen=True, slots=True)
class ForwardTimeouts:
    """How long a forwarder waits for a head: the one home of these defaults."""

    connect_s: float = 5.0
    first_byte_s: float = 60.0
    idle_s: float = 30.0  # the longest silence between two chunks of an answer

    def __post_init__(self) -> None:
        if not (self.connect_s > 0 and self.first_byte_s > 0 and self.idle_s > 0):
            raise ValueError(f"forward timeouts must be positive, got {self}")


class ForwardError(MeshRouteError):
    """The head failed before its first byte; `kind` is what the statistics record."""

    def __init__(self, kind: ErrorKind, message: str, status: int | None = None,
                 body: bytes = b"", retry_after: str | None = None) -> None:
        super().__init__(message)
        self.kind, self.status, self.body = kind, status, body
        self.retry_after = retry_after  # a 429's Retry-After header, as sent


class ForwarderClosed(MeshRouteError):
    """The gateway closed its upstream connections under an answer still being relayed (it
    is stopping, after a drain waited for what it could): no failure of the route's, and no
    bug (chat/attempts.py `internal_error` ends the client's answer as a drain's cut does)."""


class UpstreamResponse(Protocol):
    """A response whose headers arrived; the body is read with `chunks()`."""

    status: int
    headers: list[tuple[bytes, bytes]]

    def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives; ForwardError('stream') if the head dies mid-way."""
        ...

    def close(self) -> None:
        """Abort the upstream request (client went away) or release it."""
        ...


class Forwarder(Protocol):
    """Opens a POST to an upstream URL."""

    async def open(self, url: str, body: bytes,
                   headers: Iterable[tuple[bytes, bytes]]) -> UpstreamResponse:
        """Send the request and wait for the status line and headers."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


@dataclass(slots=True)
class HeldAnswer:
    """An UpstreamResponse whose body was read whole already (to look at it before deciding
    whether to relay it), served again from memory."""

    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes

    async def chunks(self) -> AsyncIterator[bytes]:
        if self.body:
            yield self.body

    def close(self) -> None:
        """Nothing to release: the upstream response was closed once read."""


@dataclass(slots=True, weakref_slot=True, eq=False)
class _AiohttpResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    raw: aiohttp.ClientResponse
    idle_s: float
    cut_off: bool = False  # the forwarder closed under it (`cut`)

    async def chunks(self) -> AsyncIterator[bytes]:
        # The silence between two chunks is bounded by aiohttp's own read timer, the
        # first-byte timeout until the body's first chunk, then idle_s (`_idle_timer`): no
        # second timer per chunk, whose objects (a Timeout, its timer handle and context)
        # each open stream kept alive.
        content = self.raw.content
        first = True
        try:
            while True:
                chunk = await content.readany()
                if not chunk:
                    return
                if first:
                    first = False
                    _idle_timer(self.raw, self.idle_s)
                yield chunk
        except TimeoutError as exc:  # aiohttp's SocketTimeoutError is one
            what = "mid-response" if not first else "before its answer's first byte"
            raise ForwardError("stream", f"the head stalled {what}") from exc
        except aiohttp.ClientError as exc:
            raise ForwardError("stream", f"the head failed mid-response: {exc!r}") from exc
        except RuntimeError as exc:
            # aiohttp's "Connection closed.": a read found the connection already closing.
            # Ours only when the forwarder closed (`cut`); else the head's connection broke.
            if self.cut_off:
                raise ForwarderClosed("upstream connections closed mid-response") from exc
            if str(exc) != _CONNECTION_CLOSED:
                raise  # no failure of the head's: a bug, reported as one
            raise ForwardError("stream", "the head's connection closed mid-response") from exc

    def close(self) -> None:
        self.raw.close()

    def cut(self) -> None:
        """The forwarder closes: a read waiting now, or the next, raises ForwarderClosed."""
        self.cut_off = True
        self.raw.content.set_exception(
            ForwarderClosed("upstream connections closed mid-response"))


class _Reuse:
    """Per request (aiohttp's `trace_request_ctx`): whether a pooled connection carried it."""

    __slots__ = ("reused",)

    def __init__(self) -> None:
        self.reused = False


class _StaleConnection(MeshRouteError):
    """A reused pooled connection failed before any answer: retry on a fresh one."""


async def _on_reuse(_session: aiohttp.ClientSession, ctx: SimpleNamespace,
                    _params: aiohttp.TraceConnectionReuseconnParams) -> None:
    if isinstance(ctx.trace_request_ctx, _Reuse):
        ctx.trace_request_ctx.reused = True


class AiohttpForwarder:
    """The real forwarder: one pooled aiohttp session, created on first use in the loop, and
    one that never pools, for the retry of a request a stale pooled connection lost."""

    def __init__(self, timeouts: ForwardTimeouts | None = None) -> None:
        timeouts = timeouts or ForwardTimeouts()
        self.idle_s = timeouts.idle_s
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=timeouts.connect_s, sock_connect=timeouts.connect_s,
            sock_read=timeouts.first_byte_s)
        self._session: aiohttp.ClientSession | None = None
        self._fresh_session: aiohttp.ClientSession | None = None
        self.stale_retries = 0  # requests retried because a pooled connection was stale
        # the answers handed out, while referenced: cut when the forwarder closes (aiohttp
        # left a read waiting on a closed session unwoken: a client's stream hung)
        self._answers: weakref.WeakSet[_AiohttpResponse] = weakref.WeakSet()

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            tracing = aiohttp.TraceConfig()
            tracing.on_connection_reuseconn.append(_on_reuse)
            self._session = self._new_session(
                aiohttp.TCPConnector(limit=0, ttl_dns_cache=300), [tracing])
        return self._session

    def _fresh(self) -> aiohttp.ClientSession:
        if self._fresh_session is None or self._fresh_session.closed:
            self._fresh_session = self._new_session(
                aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, force_close=True), [])
        return self._fresh_session

    def _new_session(self, connector: aiohttp.TCPConnector,
                     tracing: list[aiohttp.TraceConfig]) -> aiohttp.ClientSession:
        return aiohttp.ClientSession(
            connector=connector, timeout=self._timeout, auto_decompress=False,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
            trace_configs=tracing)

    async def open(self, url: str, body: bytes,
                   headers: Iterable[tuple[bytes, bytes]]) -> UpstreamResponse:
        """POST and wait for headers; 5xx and 429 become ForwardError (read, then released).
        A request a stale pooled connection lost is sent once more on a fresh connection."""
        hdrs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        hdrs.append(("accept-encoding", "identity"))
        if (tap := TAP.get()) is not None:  # traces on: the attempt's traceparent (tracing.py)
            hdrs = [h for h in hdrs if h[0].lower() not in ("traceparent", "tracestate")]
            hdrs += tap.upstream_headers()
        try:
            raw = await self._post(self._client(), url, body, hdrs, _Reuse())
        except _StaleConnection:
            self.stale_retries += 1
            raw = await self._post(self._fresh(), url, body, hdrs, None)
        if 300 <= raw.status < 400:  # never followed: the node may not choose our target
            raw.release()
            raise ForwardError("redirect", f"{url} answered {raw.status} (a redirect, not "
                               "followed)", raw.status)
        if raw.status >= 500 or raw.status == 429:
            err_body = await _read_bounded(raw)
            raw.release()
            kind: ErrorKind = "http_429" if raw.status == 429 else "http_5xx"
            raise ForwardError(kind, f"{url} answered {raw.status}", raw.status, err_body,
                               raw.headers.get("retry-after"))
        out = [(k, v) for k, v in raw.raw_headers if k.lower() not in HOP_BY_HOP]
        if (cl := raw.headers.get("content-length")) is not None:
            out.append((b"content-length", cl.encode()))
        answer = _AiohttpResponse(raw.status, out, raw, self.idle_s)
        self._answers.add(answer)
        return answer

    async def _post(self, session: aiohttp.ClientSession, url: str, body: bytes,
                    hdrs: list[tuple[str, str]], reuse: _Reuse | None) -> aiohttp.ClientResponse:
        """One POST up to the answer's headers; its failures as ForwardError, except a
        reused connection lost before any answer (`_StaleConnection`)."""
        try:
            return await session.post(url, data=body, headers=hdrs, allow_redirects=False,
                                      trace_request_ctx=reuse)
        except TimeoutError as exc:
            raise ForwardError("timeout", f"no answer from {url} in time") from _cut(exc)
        except aiohttp.ClientConnectorError as exc:
            raise ForwardError("connect", f"cannot connect to {url}: {exc.os_error}") from _cut(
                exc)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            if reuse is not None and reuse.reused:
                raise _StaleConnection from _cut(exc)
            raise ForwardError("connect", f"request to {url} failed: {exc!r}") from _cut(exc)
        except aiohttp.ClientError as exc:
            raise ForwardError("connect", f"request to {url} failed: {exc!r}") from _cut(exc)

    def metric_families(self) -> Iterator[Metric]:
        """The forwarder's own counter, for /metrics."""
        retries = CounterMetricFamily(
            "meshroute_forward_stale_retries",
            "Requests sent again on a fresh connection after a pooled one the head had "
            "closed lost them before any answer (not counted as route failures)")
        retries.add_metric([], self.stale_retries)
        yield retries

    async def aclose(self) -> None:
        """Close the sessions; the answers still being read end with ForwarderClosed."""
        for answer in list(self._answers):
            answer.cut()
        for session in (self._session, self._fresh_session):
            if session is not None:
                await session.close()
        self._session = self._fresh_session = None


def _idle_timer(raw: aiohttp.ClientResponse, idle_s: float) -> None:
    """From the body's first chunk on, aiohttp's read timer (`ClientTimeout.sock_read`,
    restarted by every byte that arrives and stopped while reading is paused) bounds the
    head's silence by `idle_s` instead of the first-byte timeout; it restarts now. aiohttp
    does the same for a websocket's receive timeout. A body already complete has no timer
    to restart."""
    conn = raw.connection
    if conn is None or conn.protocol is None or raw.content.is_eof():
        return
    conn.protocol.read_timeout = idle_s
    conn.protocol.start_timeout()


def _cut(exc: BaseException) -> BaseException:
    """Drop the locals of the finished frames in `exc`'s tracebacks (and its causes'): a
    failed connection's errors are held by those frames' locals (aiohttp, aiohappyeyeballs),
    a reference cycle per failed attempt that only a full garbage collection frees."""
    seen: BaseException | None = exc
    while seen is not None:
        traceback.clear_frames(seen.__traceback__)
        seen = seen.__cause__ or seen.__context__
    return exc


async def _read_bounded(raw: aiohttp.ClientResponse) -> bytes:
    try:
        return await raw.content.read(_ERROR_BODY_LIMIT)
    except (aiohttp.ClientError, TimeoutError):
        return b""
