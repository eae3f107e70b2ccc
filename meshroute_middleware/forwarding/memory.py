"""An in-memory Forwarder: routes to ASGI apps in this process (tests, embedding, benchmarks).

The other implementation of the forwarding seam (forwarding.AiohttpForwarder is the real one):
same ForwardError kinds, same streaming behaviour, no sockets.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import Any

from starlette.types import ASGIApp, Message

from meshroute_middleware.core.kinds import ErrorKind
from meshroute_middleware.forwarding.client import ForwardError, ForwardTimeouts


class _MemoryResponse:
    def __init__(self, status: int, headers: list[tuple[bytes, bytes]],
                 queue: asyncio.Queue[Message | BaseException], task: asyncio.Task[None]) -> None:
        self.status, self.headers = status, headers
        self._queue, self._task = queue, task
        self.idle_s = ForwardTimeouts().idle_s
        self.first_byte_s = ForwardTimeouts().first_byte_s

    async def chunks(self) -> AsyncIterator[bytes]:
        """As the real forwarder's: the first-byte timeout until the body's first chunk."""
        first = True
        while True:
            try:
                item = await asyncio.wait_for(self._queue.get(),
                                              self.first_byte_s if first else self.idle_s)
            except TimeoutError:
                what = "before its answer's first byte" if first else "mid-response"
                raise ForwardError("stream", f"the app stalled {what}") from None
            if isinstance(item, BaseException):
                raise ForwardError("stream", f"the app failed mid-response: {item!r}")
            body = item.get("body", b"")
            if body:
                first = False
                yield body
            if not item.get("more_body", False):
                return

    def close(self) -> None:
        self._task.cancel()


class ASGIForwarder:
    """Forwards to `apps[base_url]`; an unknown base URL behaves like a refused connection."""

    def __init__(self, apps: Mapping[str, ASGIApp],
                 timeouts: ForwardTimeouts | None = None) -> None:
        self.apps = dict(apps)
        self.first_byte_timeout_s = (timeouts or ForwardTimeouts()).first_byte_s
        self.idle_s = (timeouts or ForwardTimeouts()).idle_s

    async def open(self, url: str, body: bytes,
                   headers: Iterable[tuple[bytes, bytes]]) -> _MemoryResponse:
        """Run the app for this request and wait for its response headers."""
        base, _, path = url.partition("://")[2].partition("/")
        app = self.apps.get(f"http://{base}")
        if app is None:
            raise ForwardError("connect", f"cannot connect to {url}: nothing listens there")
        queue: asyncio.Queue[Message | BaseException] = asyncio.Queue()
        scope = _scope(base, "/" + path, list(headers))
        task = asyncio.ensure_future(_run(app, scope, body, queue))
        try:
            start = await asyncio.wait_for(queue.get(), self.first_byte_timeout_s)
        except TimeoutError:
            task.cancel()
            raise ForwardError("timeout", f"no answer from {url} in time") from None
        if isinstance(start, BaseException):
            raise ForwardError("http_5xx", f"{url} crashed: {start!r}", 500)
        status = int(start["status"])
        response = _MemoryResponse(status, list(start.get("headers", [])), queue, task)
        response.idle_s, response.first_byte_s = self.idle_s, self.first_byte_timeout_s
        if 300 <= status < 400:  # like the real forwarder: never followed
            task.cancel()
            raise ForwardError("redirect", f"{url} answered {status} (a redirect, not "
                               "followed)", status)
        if status >= 500 or status == 429:
            err = b"".join([c async for c in response.chunks()])
            kind: ErrorKind = "http_429" if status == 429 else "http_5xx"
            raise ForwardError(kind, f"{url} answered {status}", status, err,
                               _header(response.headers, b"retry-after"))
        return response

    async def aclose(self) -> None:
        """Nothing to release."""


def _header(headers: list[tuple[bytes, bytes]], name: bytes) -> str | None:
    """A response header's value (the first), like aiohttp's `headers.get`."""
    for key, value in headers:
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _scope(host: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    name, _, port = host.partition(":")
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(),
            "query_string": b"", "root_path": "",
            "headers": [(b"host", host.encode()), (b"content-type", b"application/json"),
                        *headers],
            "client": ("127.0.0.1", 0), "server": (name, int(port or 80))}


async def _run(app: ASGIApp, scope: dict[str, Any], body: bytes,
               queue: asyncio.Queue[Message | BaseException]) -> None:
    sent = False
    disconnected = asyncio.Event()

    async def receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    async def send(message: Message) -> None:
        await queue.put(message)

    try:
        await app(scope, receive, send)
    except asyncio.CancelledError:
        disconnected.set()
        raise
    except Exception as exc:
        await queue.put(exc)
