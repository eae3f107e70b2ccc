"""The access log (logger `meshroute.access`): one line per routed request (chat, completions,
embeddings, the dialects' APIs) saying who asked for what, where it went and how it ended
(issue 33); and the routing events published while serving a request, each naming its client.

A request's record lives in a context variable for the request's task (and the tasks it
starts): the client is read from the scope's state once `http/auth.py` has put it there, the
tokens from the client's metered usage (`AccessCounters`) or, for a request of no client,
from the answer as it passes. A client's budget or rpm refusal (429 `budget_exceeded`,
`client_rate_limited`) is a `rejected` event too.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any, TypeVar

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from meshroute_middleware.chat.headers import H_ROUTE, is_sse
from meshroute_middleware.chat.providers.tally import H_ATTEMPTS, H_TRIED
from meshroute_middleware.core.clients import CLIENT_STATE, Client
from meshroute_middleware.forwarding.measure import TokenMeter
from meshroute_middleware.telemetry.client_metrics import ClientCounters
from meshroute_middleware.telemetry.events import EventBus, Payload
from meshroute_middleware.telemetry.metrics import Telemetry

log = logging.getLogger("meshroute.access")
T = TypeVar("T")
CLIENT_REFUSALS = frozenset({"budget_exceeded", "client_rate_limited"})
_MAX_ERROR_BODY = 16_384  # an error answer read for its code; a longer one is no refusal
# the head of a request body kept for its `model`: a larger body is never held or parsed on
# the event loop (13 MiB of 480k items parsed here held /healthz 422 ms: issue 32)
_MAX_MODEL_BODY = 64 * 1024
_MODEL = re.compile(rb'[{,]\s*"model"\s*:\s*"((?:[^"\\]|\\.){0,256})"')
_H_ROUTE, _H_TRIED, _H_ATTEMPTS = H_ROUTE, H_TRIED, H_ATTEMPTS
_INFO = logging.INFO


class AccessRecord:
    """One request being served: what its access line will say, filled in as it passes. It
    is the `send` the app is given (and `receive` its bound method): one object per open
    stream (tests/chat/test_stream_footprint.py counts them)."""

    __slots__ = ("_receive", "_send", "attempts", "body", "clock", "completion_tokens", "cut",
                 "error", "meter", "prompt_tokens", "route", "start", "state",
                 "status", "ttfb_ms")

    def __init__(self, state: dict[str, Any], receive: Receive, send: Send,
                 clock: Callable[[], float]) -> None:
        self.state = state  # the scope's: the client, once authenticated
        self._receive, self._send, self.clock = receive, send, clock
        self.start = clock()
        self.body = b""  # the request body's head, as it arrived (its `model`)
        self.cut = False  # whether the body went on past _MAX_MODEL_BODY
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.status = 0
        self.route: str | None = None
        self.attempts = 0
        self.ttfb_ms: int | None = None
        self.meter: TokenMeter | None = None  # a request of no client: its answer counted
        self.error: bytearray | None = None  # an error answer's body, up to _MAX_ERROR_BODY

    def client(self) -> str | None:
        found = self.state.get(CLIENT_STATE)
        return found.name if isinstance(found, Client) else None

    def model(self) -> str | None:
        if self.cut:  # a large body: its `model` member, when the head holds it
            found = _MODEL.search(self.body)
            try:
                named = orjson.loads(b'"' + found.group(1) + b'"') if found else None
            except orjson.JSONDecodeError:
                return None
            return named if isinstance(named, str) else None
        try:
            body = orjson.loads(self.body)
        except orjson.JSONDecodeError:
            return None
        model = body.get("model") if isinstance(body, dict) else None
        return model if isinstance(model, str) else None

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.request":
            chunk = message.get("body", b"")
            if len(self.body) + len(chunk) <= _MAX_MODEL_BODY:
                self.body += chunk
            elif not self.cut:
                self.body, self.cut = (self.body + chunk)[:_MAX_MODEL_BODY], True
        return message

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self._started(message)
        elif message["type"] == "http.response.body":
            body = message.get("body", b"")
            if self.ttfb_ms is None and body:
                self.ttfb_ms = round((self.clock() - self.start) * 1000)
            if self.meter is not None:
                self.meter.feed(body)
            elif self.error is not None and len(self.error) < _MAX_ERROR_BODY:
                self.error += body
        await self._send(message)

    def _started(self, message: Message) -> None:
        self.status = int(message["status"])
        headers = message.get("headers", ())
        for name, value in headers:
            if name == _H_ROUTE:
                self.route = value.decode("latin-1")
            elif name == _H_TRIED and not self.attempts:
                self.attempts = len([t for t in value.split(b",") if t.strip()])
            elif name == _H_ATTEMPTS and value.isdigit():
                self.attempts = int(value)
        if self.route is not None and not self.attempts:
            self.attempts = 1
        if self.status >= 400:
            self.error = bytearray()
        elif self.client() is None:  # a client's come from AccessCounters
            self.meter = TokenMeter(streaming=is_sse(headers))

    def _error(self) -> dict[str, Any]:
        if not self.error:
            return {}
        try:
            body = orjson.loads(bytes(self.error))
        except orjson.JSONDecodeError:
            return {}
        error = body.get("error") if isinstance(body, dict) else None
        return error if isinstance(error, dict) else {}

    def error_code(self) -> str | None:
        error = self._error()
        code = error.get("code") or error.get("type")
        return code if isinstance(code, str) else None

    def error_message(self) -> str:
        message = self._error().get("message")
        return message if isinstance(message, str) else ""


class QuietRecord(AccessRecord):
    """A request's record with the log off (kept for its events' `client` and a client
    refusal's `rejected` event): it reads the answer's status, and an error answer's body,
    and nothing else (the line's route, attempts, first byte and tokens go unread)."""

    __slots__ = ()

    def __init__(self, state: dict[str, Any], send: Send) -> None:
        self.state, self._send = state, send
        self.status = 0
        self.error = None

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            if self.status == 429:  # the one status a client refusal has
                self.error = bytearray()
        elif self.error is not None and len(self.error) < _MAX_ERROR_BODY:
            self.error += message.get("body", b"")
        await self._send(message)


ACCESS: ContextVar[AccessRecord | None] = ContextVar("meshroute_access", default=None)


class ClientEvents(EventBus):
    """The routing event bus, each event published while serving a request carrying that
    request's `client` (null for a request of no client)."""

    def publish_lazy(self, kind: str, render: Callable[[T], Payload], content: T) -> None:
        record = ACCESS.get()  # None: no access record (the log is off), no client named
        if record is None:
            _publish_lazy(self, kind, render, content)  # the bus's own, no super() per event
        else:
            _publish_lazy(self, kind, _with_client, (render, content, record.client()))


_publish_lazy = EventBus.publish_lazy


def _with_client(item: tuple[Callable[[Any], Payload], Any, str | None]) -> Payload:
    render, content, client = item
    return {**render(content), "client": client}


class AccessCounters(ClientCounters):
    """Clients' counters that also hand a request's metered tokens to its access record."""

    def count(self, client: str, route: str, status: int, prompt_tokens: int,
              completion_tokens: int, cost_usd: float, cached_tokens: int = 0,
              cache_write_tokens: int = 0) -> None:
        super().count(client, route, status, prompt_tokens, completion_tokens, cost_usd,
                      cached_tokens, cache_write_tokens)
        record = ACCESS.get()
        if record is not None:
            record.prompt_tokens, record.completion_tokens = prompt_tokens, completion_tokens


class AccessLog:
    """ASGI wrapper: one `meshroute.access` line per request on `paths` (when INFO is on).
    With `clients()` true (any [[clients]] configured now: a reload may add some), a request's
    record is kept with the log off too, for its events' `client` and a client refusal's
    `rejected` event (without the body's head or the answer's tokens, which only the line
    reads); with neither, a request passes straight through."""

    def __init__(self, app: ASGIApp, telemetry: Telemetry, paths: Iterable[str],
                 clock: Callable[[], float] = time.perf_counter,
                 clients: Callable[[], bool] = lambda: True) -> None:
        self.app, self.telemetry, self.paths, self.clock = app, telemetry, frozenset(paths), clock
        self.clients = clients

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        logged = log.isEnabledFor(_INFO)
        if not logged and not self.clients():  # no line to write, no client to name
            await self.app(scope, receive, send)
            return
        state = scope.get("state")
        if not isinstance(state, dict):
            scope["state"] = state = {}
        record = (AccessRecord(state, receive, send, self.clock) if logged
                  else QuietRecord(state, send))
        token = ACCESS.set(record)
        try:  # the body's head is kept for the line's `model` only
            await self.app(scope, record.receive if logged else receive, record)
        finally:
            ACCESS.reset(token)
            self._done(scope, record, logged)

    def _done(self, scope: Scope, record: AccessRecord, logged: bool) -> None:
        code = record.error_code() if record.error else None
        if record.status == 429 and code in CLIENT_REFUSALS:
            token = ACCESS.set(record)  # the event names the client
            try:
                self.telemetry.reject("clients", f"{record.client()}: {code}: "
                                      f"{record.error_message()}", code or "")
            finally:
                ACCESS.reset(token)
        if not logged:
            return
        client = record.client()
        prompt, completion = record.prompt_tokens, record.completion_tokens
        if completion is None and record.meter is not None and record.status == 200:
            completion, prompt = record.meter.completion_tokens, record.meter.prompt_tokens
        fields = {
            "client": client, "model": record.model(), "path": scope["path"],
            "route": record.route, "attempts": record.attempts, "status": record.status or 499,
            "ttfb_ms": record.ttfb_ms,
            "duration_ms": round((self.clock() - record.start) * 1000),
            "prompt_tokens": prompt, "completion_tokens": completion, "error": code}
        line = log.makeRecord(log.name, logging.INFO, __file__, 0, "%s", (_Line(fields),),
                              None, extra={"access": fields})  # no caller lookup: ~20 µs
        log.handle(line)


class _Line:
    """An access line's text form, made only when a handler formats it."""

    __slots__ = ("fields",)

    def __init__(self, fields: dict[str, Any]) -> None:
        self.fields = fields

    def __str__(self) -> str:
        return " ".join(f"{k}={'-' if v is None else v}" for k, v in self.fields.items())
