"""Forwarding a chat request to a route's head over HTTP (aiohttp, chosen by measurement).

The transport seam: `Forwarder` opens an upstream response whose body can be relayed chunk by
chunk. Failures before the first byte are raised as ForwardError with a kind the router records.

The forwarder never follows a redirect (a head answering 3xx is a failed attempt: following it
would let a node point the gateway at any URL it likes), asks for an identity encoding and keeps
`content-encoding` if a head compresses anyway (the bytes are relayed as they came, so the
header must stay with them), and gives up on a head that stays silent between two chunks for
longer than `ForwardTimeouts.idle_s`.
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Protocol

import aiohttp

# Response headers a head's answer loses on its way (chat.headers drops the rest: cookies,
# the head's own date/server). content-length is re-added from the parsed value.
HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailer", b"transfer-encoding", b"upgrade", b"host", b"content-length",
    b"accept-encoding", b"proxy-connection",
})
_ERROR_BODY_LIMIT = 64 * 1024


@dataclass(frozen=True, slots=True)
class ForwardTimeouts:
    """How long a forwarder waits for a head: the one home of these defaults."""

    connect_s: float = 5.0
    first_byte_s: float = 60.0
    idle_s: float = 30.0  # the longest silence between two chunks of an answer

    def __post_init__(self) -> None:
        if not (self.connect_s > 0 and self.first_byte_s > 0 and self.idle_s > 0):
            raise ValueError(f"forward timeouts must be positive, got {self}")


class ForwardError(Exception):
    """The head failed before its first byte; `kind` is what the statistics record."""

    def __init__(self, kind: str, message: str, status: int | None = None,
                 body: bytes = b"", retry_after: str | None = None) -> None:
        super().__init__(message)
        self.kind, self.status, self.body = kind, status, body
        self.retry_after = retry_after  # a 429's Retry-After header, as sent


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
class _AiohttpResponse:
    status: int
    headers: list[tuple[bytes, bytes]]
    raw: aiohttp.ClientResponse
    idle_s: float

    async def chunks(self) -> AsyncIterator[bytes]:
        content = self.raw.content
        try:
            while True:
                async with asyncio.timeout(self.idle_s):
                    chunk = await content.readany()
                if not chunk:
                    return
                yield chunk
        except TimeoutError as exc:
            raise ForwardError("stream", "the head stalled mid-response") from exc
        except aiohttp.ClientError as exc:
            raise ForwardError("stream", f"the head failed mid-response: {exc!r}") from exc

    def close(self) -> None:
        self.raw.close()


class AiohttpForwarder:
    """The real forwarder: one pooled aiohttp session, created on first use in the loop."""

    def __init__(self, timeouts: ForwardTimeouts | None = None) -> None:
        timeouts = timeouts or ForwardTimeouts()
        self.idle_s = timeouts.idle_s
        self._timeout = aiohttp.ClientTimeout(
            total=None, connect=timeouts.connect_s, sock_connect=timeouts.connect_s,
            sock_read=timeouts.first_byte_s)
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self._timeout, auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"))
        return self._session

    async def open(self, url: str, body: bytes,
                   headers: Iterable[tuple[bytes, bytes]]) -> UpstreamResponse:
        """POST and wait for headers; 5xx and 429 become ForwardError (read, then released)."""
        hdrs = [(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers]
        hdrs.append(("accept-encoding", "identity"))
        try:
            raw = await self._client().post(url, data=body, headers=hdrs,
                                            allow_redirects=False)
        except TimeoutError as exc:
            raise ForwardError("timeout", f"no answer from {url} in time") from _cut(exc)
        except aiohttp.ClientConnectorError as exc:
            raise ForwardError("connect", f"cannot connect to {url}: {exc.os_error}") from _cut(
                exc)
        except aiohttp.ClientError as exc:
            raise ForwardError("connect", f"request to {url} failed: {exc!r}") from _cut(exc)
        if 300 <= raw.status < 400:  # never followed: the node may not choose our target
            raw.release()
            raise ForwardError("redirect", f"{url} answered {raw.status} (a redirect, not "
                               "followed)", raw.status)
        if raw.status >= 500 or raw.status == 429:
            err_body = await _read_bounded(raw)
            raw.release()
            kind = "http_429" if raw.status == 429 else "http_5xx"
            raise ForwardError(kind, f"{url} answered {raw.status}", raw.status, err_body,
                               raw.headers.get("retry-after"))
        out = [(k, v) for k, v in raw.raw_headers if k.lower() not in HOP_BY_HOP]
        if (cl := raw.headers.get("content-length")) is not None:
            out.append((b"content-length", cl.encode()))
        return _AiohttpResponse(raw.status, out, raw, self.idle_s)

    async def aclose(self) -> None:
        """Close the session."""
        if self._session is not None:
            await self._session.close()
            self._session = None


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
