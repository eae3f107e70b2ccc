"""The HTTP edge of `meshroute serve`: the limits uvicorn (with httptools) does not enforce.

Measured with uvicorn 0.54 / httptools 0.9 (docs/security.md, "The HTTP edge"): httptools
buffers a header of any size and any number of header lines, and uvicorn has no timeout for
a request head that never completes nor for a connection that never sends a byte;
`limit_concurrency` answers 503 only once a head is complete, so half-sent requests hold file
descriptors until the process runs out of them. `EdgeProtocol` is uvicorn's httptools
protocol with these limits added, each refusal an OpenAI-style JSON error with
`connection: close`, counted (`meshroute_rejected{source="http"}`) and logged (at most once
a second, with the number refused since):

- more than `max_connections` open connections: 503 `too_many_connections` at once;
- a request head over `max_header_bytes` or with more than `max_headers` lines: 431
  `headers_too_large` (counted as it arrives: the buffer never grows past the limit);
- a head not complete `header_timeout_s` after the connection opened or the request began:
  408 `request_timeout`;
- a malformed request: 400 `invalid_request` (uvicorn answers plain text).

Only the head counts toward `max_header_bytes`: a body up to `--max-body-bytes` passes however
its bytes arrive, in the head's read or after it. Parsing stays uvicorn's (`data_received` is
extended, not copied); its plain-text 400 is replaced through `send_400_response`.

The body's own timeout is the middleware's (`read_body`, 408), so it holds under any server.
Outgoing sockets (health probes, gossip) are not connections of this server: the limit does
not starve them.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from meshroute_middleware.http.errors import HttpError

log = logging.getLogger("meshroute.edge")


@dataclass(frozen=True, slots=True)
class EdgeLimits:
    """The HTTP edge's limits: the one home of their defaults."""

    max_connections: int = 512
    max_header_bytes: int = 64 * 1024
    max_headers: int = 100
    header_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if min(self.max_connections, self.max_header_bytes, self.max_headers) < 1:
            raise ValueError(f"edge limits must be positive, got {self}")
        if not self.header_timeout_s > 0:
            raise ValueError(f"header_timeout_s must be positive, got {self.header_timeout_s}")


DESCRIPTOR_MARGIN = 256  # descriptors kept for outgoing sockets, files, gossip, mDNS


def fit_descriptor_limit(max_connections: int) -> None:
    """Raise the soft descriptor limit so `max_connections` client sockets leave room for
    health probes, forwarding and gossip; warn if the hard limit does not allow it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = max_connections + DESCRIPTOR_MARGIN
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        target = soft
    if target < need:
        log.warning("only %d file descriptors: --max-connections %d leaves too few for "
                    "health probes and forwarding; lower it or raise `ulimit -n`",
                    target, max_connections)


class _RefusalLog:
    """Logs refusals at most once a second, saying how many there were since."""

    def __init__(self) -> None:
        self.last = 0.0
        self.quiet = 0

    def __call__(self, client: Any, status: int, reason: str) -> None:
        now = time.monotonic()
        if now - self.last < 1.0:
            self.quiet += 1
            return
        more = f" (and {self.quiet} more refusals in the last second)" if self.quiet else ""
        log.warning("refused a connection from %s: %d %s%s", client, status, reason, more)
        self.last, self.quiet = now, 0


_PARSE_WARNING = "Invalid HTTP request received."  # uvicorn's, once per malformed request


class _OwnRefusalLog(logging.Filter):
    """Drops uvicorn's warning per malformed request: the edge logs its 400 refusals itself,
    at most once a second (an attacker's flood of bad requests must not flood the log)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != _PARSE_WARNING


_UVICORN_LOG_FILTER = _OwnRefusalLog()


def edge_protocol(limits: EdgeLimits,
                  on_reject: Callable[[str, str], None] = lambda source, reason: None,
                  ) -> type[asyncio.Protocol]:
    """uvicorn's httptools protocol with `limits`; `on_reject(source, reason)` counts."""
    refused_log = _RefusalLog()
    logging.getLogger("uvicorn.error").addFilter(_UVICORN_LOG_FILTER)  # once: filters are a set

    class EdgeProtocol(HttpToolsProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._head_bytes = 0  # of the head's parts as parsed
            self._raw_head = 0  # bytes received while a head is incomplete
            self._header_lines = 0
            self._head_done = False
            self._in_head = False  # a request began and its head is not complete yet
            self._completed = False  # a request ended during the current data_received
            self._too_large = False
            self._refused = False
            self._head_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > limits.max_connections:
                self._refuse(HttpError.TOO_MANY_CONNECTIONS, f"the gateway holds its maximum "
                             f"of {limits.max_connections} connections; retry later")
                return
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(limits.header_timeout_s, self._timeout)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _timeout(self) -> None:
            self._head_timer = None
            if not self._head_done and not self._refused:
                self._refuse(HttpError.REQUEST_TIMEOUT, f"the request head did not arrive within "
                             f"{limits.header_timeout_s:g} s")

        def _refuse(self, error: HttpError, message: str) -> None:
            self._refused = True
            self._disarm()
            status, code, body = error.status, error.code, error.answer(message).body()
            head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\n"
                    "content-type: application/json\r\n"
                    f"content-length: {len(body)}\r\nconnection: close\r\n\r\n").encode()
            if not self.transport.is_closing():
                self.transport.write(head + body)
                self.transport.close()
            on_reject("http", f"{status} {code}")
            refused_log(self.client, status, code)

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return
            was_in_head, self._completed = self._in_head, False
            super().data_received(data)  # uvicorn's parsing; errors come to send_400_response
            if self._refused or not self._in_head:
                return
            # The head is still incomplete, so httptools may be buffering a part of it. Only
            # the bytes of this head count: all of `data` when the head had begun before it
            # or began with it. When an earlier (pipelined) request ended inside `data` the
            # split is unknown and the count starts with the next read: one read more at most.
            if was_in_head or not self._completed:
                self._raw_head += len(data)
                if self._raw_head > limits.max_header_bytes:
                    self._refuse(HttpError.HEADERS_TOO_LARGE, f"the request head exceeds "
                                 f"{limits.max_header_bytes} bytes")

        def send_400_response(self, msg: str) -> None:
            """A malformed request: an OpenAI-style 400 (uvicorn answers plain text)."""
            if not self._refused:
                self._refuse(HttpError.INVALID_REQUEST, "malformed HTTP request")

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head_bytes = self._raw_head = self._header_lines = 0
            self._head_done = self._too_large = False
            self._in_head = True
            self._arm()

        def on_url(self, url: bytes) -> None:
            self._head_bytes += len(url)
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._header_lines += 1
            self._head_bytes += len(name) + len(value) + 4
            if (self._header_lines > limits.max_headers
                    or self._head_bytes > limits.max_header_bytes):
                self._too_large = True
                return  # not kept: the request is refused when its head ends
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._head_done, self._in_head = True, False
            self._disarm()
            if self._refused:
                return
            if self._too_large:
                self._refuse(HttpError.HEADERS_TOO_LARGE, f"the request head exceeds "
                             f"{limits.max_headers} lines or {limits.max_header_bytes} bytes")
                return
            super().on_headers_complete()

        def on_body(self, body: bytes) -> None:
            if not self._refused:
                super().on_body(body)

        def on_message_complete(self) -> None:
            self._completed = True
            if not self._refused:
                super().on_message_complete()
                self._head_done = False

    return EdgeProtocol
