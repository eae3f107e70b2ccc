"""MeshRouteMiddleware: pure ASGI; picks a route for each chat request and measures it.

forward:  the request goes to the chosen route's head; the response streams back untouched.
annotate: the wrapped app serves the request itself, told the plan in headers and in
          scope["state"]["meshroute"]; the middleware measures the app's response.
Either way failures before the first byte fall back down the ranked routes, and every
response carries x-meshroute-route and x-meshroute-mode.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .core import (
    Decision,
    InvalidPinError,
    NoRouteError,
    Outcome,
    Route,
    Router,
    RouterConfig,
    UnknownModelError,
)
from .forwarding import AiohttpForwarder, Forwarder, ForwardError, UpstreamResponse
from .httperrors import send_error
from .measure import TokenMeter, sse_error_event
from .request import ChatRequest, RequestError, parse_chat, read_body, replay
from .telemetry import Telemetry

log = logging.getLogger("meshroute.middleware")
CHAT_PATH = "/v1/chat/completions"
H_ROUTE, H_PLAN, H_MODE = b"x-meshroute-route", b"x-meshroute-plan", b"x-meshroute-mode"
_OURS = (b"x-meshroute-",)
_HOP_BY_HOP_REQUEST = frozenset({
    b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding",
    b"upgrade", b"te", b"trailer", b"proxy-authorization", b"proxy-connection",
    b"accept-encoding",
})


@dataclass(frozen=True, slots=True)
class MiddlewareConfig:
    """How the middleware behaves; `router` configures the Router it builds if none is given."""

    mode: str = "forward"  # "forward" | "annotate"
    max_body_bytes: int = 16 * 1024 * 1024
    connect_timeout_s: float = 5.0
    first_byte_timeout_s: float = 60.0
    router: RouterConfig = field(default_factory=RouterConfig)
    seed: int | None = None
    path: str = CHAT_PATH

    def __post_init__(self) -> None:
        if self.mode not in ("forward", "annotate"):
            raise ValueError(f"mode must be 'forward' or 'annotate', got {self.mode!r}")
        if self.max_body_bytes <= 0:
            raise ValueError("max_body_bytes must be positive")


WATCH_AFTER_S = 0.02  # start watching for a client that leaves once a request lasts this long
_PLAN_CACHE: dict[str, tuple[Route, bytes, bytes]] = {}
_PLAN_CACHE_MAX = 4096  # signature -> (route, signature, plan header) of its last route
_MODES: dict[str, bytes] = {}


def _plan_of(route: Route) -> tuple[Route, bytes, bytes]:
    """A route's signature and plan header, encoded once per route object (hot path)."""
    cached = _PLAN_CACHE.get(route.signature)
    if cached is not None and cached[0] is route:
        return cached
    if len(_PLAN_CACHE) >= _PLAN_CACHE_MAX:
        _PLAN_CACHE.clear()
    cached = _PLAN_CACHE[route.signature] = (
        route, route.signature.encode(), route.plan_header().encode())
    return cached


def _mode(mode: str) -> bytes:
    encoded = _MODES.get(mode)
    if encoded is None:
        encoded = _MODES[mode] = mode.encode()
    return encoded


def route_headers(decision: Decision) -> list[tuple[bytes, bytes]]:
    """The plan of a decision as request headers for a head (or the annotated app)."""
    _, signature, plan = _plan_of(decision.route)
    return [(H_ROUTE, signature), (H_PLAN, plan), (H_MODE, _mode(decision.mode))]


def _response_headers(decision: Decision) -> list[tuple[bytes, bytes]]:
    return [(H_ROUTE, _plan_of(decision.route)[1]), (H_MODE, _mode(decision.mode))]


def _with_ours(headers: Iterable[tuple[bytes, bytes]],
               decision: Decision) -> list[tuple[bytes, bytes]]:
    """Response headers with ours appended; any x-meshroute-* a head sent is dropped, so the
    client sees exactly one route and mode: the gateway's."""
    signature = _plan_of(decision.route)[1]
    out = [(k, v) for k, v in headers if not k.lower().startswith(_OURS)]
    out += ((H_ROUTE, signature), (H_MODE, _mode(decision.mode)))
    return out


def _client_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    """Request headers worth forwarding: no hop-by-hop, no client-supplied x-meshroute-*."""
    return [(k, v) for k, v in scope.get("headers", ())
            if k not in _HOP_BY_HOP_REQUEST and not k.startswith(_OURS)]


def _is_sse(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    for k, v in headers:
        if k.lower() == b"content-type":
            return v.startswith(b"text/event-stream")
    return False


class MeshRouteMiddleware:
    """Pure ASGI middleware in front of any chat server (starlette style)."""

    def __init__(self, app: ASGIApp, config: MiddlewareConfig | None = None, *,
                 router: Router | None = None, forwarder: Forwarder | None = None,
                 telemetry: Telemetry | None = None) -> None:
        self.app = app
        self.config = config or MiddlewareConfig()
        self.router = router or Router(self.config.router, clock=time.time,
                                       rng=random.Random(self.config.seed))
        self.forwarder = forwarder or AiohttpForwarder(
            self.config.connect_timeout_s, self.config.first_byte_timeout_s)
        self.telemetry = telemetry or Telemetry(self.router)
        self.annotate = self.config.mode == "annotate"
        self._watchdog = _Watchdog()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._lifespan_send(send))
        elif (scope["type"] != "http" or scope["method"] != "POST"
              or scope["path"] != self.config.path):
            await self.app(scope, receive, send)
        else:
            await self._chat(scope, receive, send)

    def _lifespan_send(self, send: Send) -> Send:
        async def _send(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                await self.forwarder.aclose()
            await send(message)
        return _send

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            req = parse_chat(await read_body(scope, receive, self.config.max_body_bytes))
            decision = self._decide(req)
        except RequestError as exc:
            if exc.status != 499:
                await send_error(send, exc.status, str(exc), exc.code)
            return
        except _PassThrough as exc:
            await self.app(scope, replay(exc.body, receive), send)
            return
        except NoRouteError as exc:
            await send_error(send, 503, str(exc), "no_route_available", routes=exc.reasons)
            return
        except Exception:  # a bug of ours while choosing: a JSON error, never a traceback
            log.exception("meshroute: internal error while choosing a route")
            await send_error(send, 500, "internal error in meshroute; see the server log",
                             "internal_error")
            return
        ex = _Exchange(send)
        self.telemetry.in_flight += 1
        try:
            if self.annotate:
                await self._annotate(scope, receive, ex, req, decision)
            else:
                await self._forward(scope, receive, ex, req, decision)
        except Exception:
            # A bug of ours must not leave a client with a traceback or a hung request.
            log.exception("meshroute: internal error while routing a chat request")
            if ex.started:
                raise
            await send_error(send, 500, "internal error in meshroute; see the server log",
                             "internal_error")
        finally:
            self.telemetry.in_flight -= 1
            for attempt in ex.attempts:  # whatever ended abnormally leaves the in-flight count
                self.router.cancel(attempt)

    def _decide(self, req: ChatRequest) -> Decision:
        try:
            return self.router.choose(req.model, req.pin)
        except UnknownModelError as exc:
            if self.annotate and req.pin is None:
                raise _PassThrough(req.body) from exc  # the app may serve it by itself
            raise RequestError(404, f"model {req.model!r} is not served by any known route",
                               "model_not_found") from exc
        except InvalidPinError as exc:
            raise RequestError(400, str(exc), "invalid_route") from exc

    def _finish(self, decision: Decision, outcome: Outcome) -> None:
        result = self.router.record(decision, outcome)
        self.telemetry.finished(decision, outcome, result)

    # -- forward mode -----------------------------------------------------------------
    async def _forward(self, scope: Scope, receive: Receive, ex: _Exchange, req: ChatRequest,
                       first: Decision) -> None:
        """Forward with fallback; a client that goes away cancels whatever is under way
        (waiting for a head's first byte included) and so closes the upstream request."""
        task = self._watchdog.add(ex, receive)
        try:
            await self._attempts(scope, ex, req, first)
        except asyncio.CancelledError:
            if not ex.gone:
                raise
            task.uncancel()  # our own cancellation: the client left; nothing more to send
        finally:
            self._watchdog.discard(ex)
            if ex.watcher is not None:
                ex.watcher.cancel()
            ex.task = None

    async def _attempts(self, scope: Scope, ex: _Exchange, req: ChatRequest,
                        first: Decision) -> None:
        headers = _client_headers(scope)
        failures: dict[str, str] = {}
        kinds: list[str] = []
        decision: Decision | None = first
        while decision is not None:
            ex.attempts.append(decision)
            self.telemetry.decided(decision)
            start = time.perf_counter()
            try:
                upstream = await self.forwarder.open(
                    decision.route.head.url + CHAT_PATH, req.body,
                    headers + route_headers(decision))
            except ForwardError as exc:
                self._finish(decision, Outcome(0, time.perf_counter() - start, 0.0, exc.kind))
                failures[decision.signature] = str(exc)
                kinds.append(exc.kind)
                decision = self.router.fallback(decision)
                continue
            await self._relay(decision, upstream, ex, start)
            return
        rate_limited = bool(kinds) and all(k == "http_429" for k in kinds)
        status, code = (429, "rate_limited") if rate_limited else (503, "no_route_available")
        await send_error(ex.send, status, f"every route for {req.model!r} failed before its "
                         "first byte", code, routes=failures)

    async def _relay(self, decision: Decision, upstream: UpstreamResponse, ex: _Exchange,
                     start: float) -> None:
        """Stream the head's answer to the client, measuring it; then record the attempt.
        A client that left before any byte says nothing of the route, one that left mid-way
        leaves a sample of what was delivered until then."""
        if 400 <= upstream.status < 500:
            self.router.cancel(decision)  # the client's own mistake says nothing of the route
            await self._pipe_plain(decision, upstream, ex)
            return
        send = ex.send
        meter = TokenMeter(streaming=_is_sse(upstream.headers))
        first: float | None = None
        error = ""
        try:
            ex.started = True
            await send({"type": "http.response.start", "status": upstream.status,
                        "headers": _with_ours(upstream.headers, decision)})
            try:
                async for chunk in upstream.chunks():
                    if first is None:
                        first = time.perf_counter()
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    meter.feed(chunk)  # counted once on its way: the client does not wait
            except ForwardError as exc:
                error = exc.kind
        except OSError:
            ex.gone = True
        except BaseException:  # cancelled (the client left) or a bug: record, then go on
            upstream.close()
            self._settle(decision, meter, start, first, time.perf_counter(), error, ex.gone)
            raise
        upstream.close()
        last = time.perf_counter()
        if not ex.gone:
            # The client's response ends before the bookkeeping: a stream's last chunk is
            # not held back by recording it.
            tail = b""
            if error and meter.streaming:
                tail = sse_error_event("the route's head failed mid-stream; partial response")
            try:
                await send({"type": "http.response.body", "body": tail, "more_body": False})
            except OSError:
                ex.gone = True
            except BaseException:
                self._settle(decision, meter, start, first, last, error, ex.gone)
                raise
        self._settle(decision, meter, start, first, last, error, ex.gone)

    def _settle(self, decision: Decision, meter: TokenMeter, start: float, first: float | None,
                last: float, error: str, gone: bool) -> None:
        """Record a relayed attempt: a client that left before any byte says nothing of the
        route; one that left mid-way leaves a sample of what was delivered until then."""
        if gone and first is None:
            self.router.cancel(decision)
            return
        ttfb = last - start if first is None else first - start
        self._finish(decision, Outcome(meter.completion_tokens, last - start, ttfb, error))

    async def _pipe_plain(self, decision: Decision, upstream: UpstreamResponse,
                          ex: _Exchange) -> None:
        try:
            ex.started = True
            await ex.send({"type": "http.response.start", "status": upstream.status,
                           "headers": _with_ours(upstream.headers, decision)})
            async for chunk in upstream.chunks():
                await ex.send({"type": "http.response.body", "body": chunk, "more_body": True})
            await ex.send({"type": "http.response.body", "body": b"", "more_body": False})
        except (ForwardError, OSError):
            pass
        finally:
            upstream.close()

    # -- annotate mode ----------------------------------------------------------------
    async def _annotate(self, scope: Scope, receive: Receive, ex: _Exchange, req: ChatRequest,
                        first: Decision) -> None:
        decision: Decision | None = first
        while decision is not None:
            ex.attempts.append(decision)
            self.telemetry.decided(decision)
            attempt = _Attempt(decision, ex)
            inner = self._annotated_scope(scope, decision)
            try:
                await self.app(inner, replay(req.body, receive), attempt.send)
            except Exception:
                if attempt.started:
                    self._finish(decision, attempt.outcome("app_error"))
                    raise
                attempt.failed_early = "app_error"
            if not attempt.failed_early:
                self._finish_annotated(decision, attempt)
                return
            self._finish(decision, attempt.outcome(attempt.failed_early))
            nxt = self.router.fallback(decision)
            if nxt is None:
                await attempt.flush_held(req.model)
                return
            decision = nxt

    def _finish_annotated(self, decision: Decision, attempt: _Attempt) -> None:
        client_error = attempt.status is not None and 400 <= attempt.status < 500
        if client_error or (attempt.gone and attempt.first is None):
            self.router.cancel(decision)
        else:
            self._finish(decision, attempt.outcome(""))

    @staticmethod
    def _annotated_scope(scope: Scope, decision: Decision) -> Scope:
        headers = [(k, v) for k, v in scope.get("headers", ()) if not k.startswith(_OURS)]
        state = dict(scope.get("state") or {})
        _, signature, plan_header = _plan_of(decision.route)
        state["meshroute"] = {"signature": decision.signature, "mode": decision.mode,
                              # the app's own copy: the cached plan must not be mutable by it
                              "plan": decision.route.plan(), "attempt": decision.attempt}
        headers += ((H_ROUTE, signature), (H_PLAN, plan_header), (H_MODE, _mode(decision.mode)))
        return {**scope, "headers": headers, "state": state}


class _Exchange:
    """One chat request being served: its client's send, and what its error path, the
    disconnect watcher and the in-flight bookkeeping need to know."""

    __slots__ = ("attempts", "gone", "receive", "seen", "send", "started", "task", "watcher")

    def __init__(self, send: Send) -> None:
        self.send = send
        self.started = False  # the client got a response start: too late for an error reply
        self.gone = False  # the client disconnected
        self.attempts: list[Decision] = []
        self.task: asyncio.Task[Any] | None = None  # the task serving it (forward mode)
        self.receive: Receive | None = None
        self.seen = False  # a watchdog sweep has seen it under way
        self.watcher: asyncio.Task[None] | None = None


class _Watchdog:
    """Watches forwarded requests for a client that leaves, once they last a while.

    Most requests to a fast head are over within milliseconds, and a task (or even a timer)
    per request costs more than the rest of the middleware's bookkeeping. So one timer ticks
    every WATCH_AFTER_S while requests are under way: a request seen by two sweeps has lasted
    at least that long and gets a watcher task reading `receive` for `http.disconnect`.
    """

    def __init__(self) -> None:
        self._active: dict[_Exchange, None] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def add(self, ex: _Exchange, receive: Receive) -> asyncio.Task[Any]:
        """Watch a request from the task serving it; return that task.

        The loop is looked up once, not per request: asyncio's get_running_loop() makes a
        getpid() system call each time, and current_task(loop) with the loop given does not.
        """
        loop = self._loop
        task = asyncio.current_task(loop) if loop is not None else None
        if loop is None or task is None:  # first request, or a new event loop (tests)
            loop = self._loop = asyncio.get_running_loop()
            self._timer = None
            task = asyncio.current_task(loop)
            assert task is not None
        ex.task, ex.receive = task, receive
        self._active[ex] = None
        if self._timer is None:
            self._timer = loop.call_later(WATCH_AFTER_S, self._sweep)
        return task

    def discard(self, ex: _Exchange) -> None:
        self._active.pop(ex, None)

    def _sweep(self) -> None:
        self._timer = None
        for ex in self._active:
            if ex.seen and ex.watcher is None and ex.task is not None and ex.receive is not None:
                ex.watcher = asyncio.ensure_future(_watch_disconnect(ex.receive, ex.task, ex))
            ex.seen = True
        if self._active and self._loop is not None and not self._loop.is_closed():
            self._timer = self._loop.call_later(WATCH_AFTER_S, self._sweep)


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any], ex: _Exchange) -> None:
    """Wait for the client to leave, then cancel the task serving it."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            ex.gone = True
            task.cancel()
            return


class _PassThrough(Exception):
    def __init__(self, body: bytes) -> None:
        super().__init__("pass through")
        self.body = body


class _Attempt:
    """Wraps the app's send for one annotated attempt: adds headers, measures, and holds a
    5xx/429 answer back so that the middleware can fall back before the client sees a byte."""

    def __init__(self, decision: Decision, ex: _Exchange) -> None:
        self.decision, self._ex, self._send = decision, ex, ex.send
        self.start = time.perf_counter()
        self.first: float | None = None
        self.last: float | None = None
        self.status: int | None = None
        self.started = False
        self.gone = False
        self.failed_early = ""
        self.meter: TokenMeter | None = None
        self._held: list[Message] = []

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = int(message["status"])
            if self.status >= 500 or self.status == 429:
                self.failed_early = "http_429" if self.status == 429 else "http_5xx"
                self._held.append(message)
                return
            headers = _with_ours(message.get("headers", ()), self.decision)
            self.meter = TokenMeter(streaming=_is_sse(headers))
            message = {**message, "headers": headers}
            self.started = self._ex.started = True
        elif kind == "http.response.body":
            if self.failed_early:
                self._held.append(message)
                return
            body = message.get("body", b"")
            now = time.perf_counter()
            if body and self.first is None:
                self.first = now
            if not message.get("more_body", False):
                self.last = now
            try:
                await self._send(message)
            except OSError:
                self.gone = True
                raise
            if self.meter is not None:
                self.meter.feed(body)  # counted once on its way: the client does not wait
            return
        try:
            await self._send(message)
        except OSError:
            self.gone = True
            raise

    def outcome(self, error: str) -> Outcome:
        """The attempt's outcome as the router records it."""
        last = self.last or time.perf_counter()
        tokens = self.meter.completion_tokens if self.meter else 0
        first = self.first if self.first is not None else last
        return Outcome(tokens, last - self.start, first - self.start, error)

    async def flush_held(self, model: str) -> None:
        """No route left: the client gets the last failing answer as it was."""
        self._ex.started = True
        if self._held:
            first = self._held[0]
            self._held[0] = {**first, "headers": _with_ours(first.get("headers", ()),
                                                            self.decision)}
            for message in self._held:
                await self._send(message)
            return
        await send_error(self._send, 503, f"every route for {model!r} failed before its "
                         "first byte", "no_route_available", _response_headers(self.decision))
