"""MeshRouteMiddleware: pure ASGI; picks a route for each chat request and measures it.

forward:  the request goes to the chosen route's head; the response streams back untouched.
annotate: the wrapped app serves the request itself, told the plan in headers and in
          scope["state"]["meshroute"]; the middleware measures the app's response.
Either way failures before the first byte fall back down the ranked routes, and every
response carries x-meshroute-route and x-meshroute-mode.
"""

from __future__ import annotations

import asyncio
import contextlib
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
_PLAN_CACHE: dict[str, tuple[Route, bytes]] = {}  # signature -> (route, plan header)
_PLAN_CACHE_MAX = 4096


def _plan_bytes(route: Route) -> bytes:
    """The x-meshroute-plan header of a route, encoded once per route object."""
    cached = _PLAN_CACHE.get(route.signature)
    if cached is not None and cached[0] is route:
        return cached[1]
    if len(_PLAN_CACHE) >= _PLAN_CACHE_MAX:
        _PLAN_CACHE.clear()
    plan = route.plan_header().encode()
    _PLAN_CACHE[route.signature] = (route, plan)
    return plan


def route_headers(decision: Decision) -> list[tuple[bytes, bytes]]:
    """The plan of a decision as request headers for a head (or the annotated app)."""
    return [(H_ROUTE, decision.signature.encode()), (H_PLAN, _plan_bytes(decision.route)),
            (H_MODE, decision.mode.encode())]


def _response_headers(decision: Decision) -> list[tuple[bytes, bytes]]:
    return [(H_ROUTE, decision.signature.encode()), (H_MODE, decision.mode.encode())]


def _with_ours(headers: Iterable[tuple[bytes, bytes]],
               decision: Decision) -> list[tuple[bytes, bytes]]:
    """Response headers with ours appended; any x-meshroute-* a head sent is dropped, so the
    client sees exactly one route and mode: the gateway's."""
    return [(k, v) for k, v in headers if not k.lower().startswith(_OURS)] + _response_headers(
        decision)


def _client_headers(scope: Scope) -> list[tuple[bytes, bytes]]:
    """Request headers worth forwarding: no hop-by-hop, no client-supplied x-meshroute-*."""
    return [(k, v) for k, v in scope.get("headers", ())
            if k not in _HOP_BY_HOP_REQUEST and not k.startswith(_OURS)]


def _is_sse(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    return any(k.lower() == b"content-type" and v.startswith(b"text/event-stream")
               for k, v in headers)


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
        self.telemetry.in_flight += 1
        attempts: list[Decision] = []
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            if self.annotate:
                await self._annotate(scope, receive, tracked_send, req, decision, attempts)
            else:
                await self._forward(scope, receive, tracked_send, req, decision, attempts)
        except Exception:
            # A bug of ours must not leave a client with a traceback or a hung request.
            log.exception("meshroute: internal error while routing a chat request")
            if started:
                raise
            await send_error(send, 500, "internal error in meshroute; see the server log",
                             "internal_error")
        finally:
            self.telemetry.in_flight -= 1
            for attempt in attempts:  # whatever ended abnormally leaves the in-flight count
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
    async def _forward(self, scope: Scope, receive: Receive, send: Send, req: ChatRequest,
                       first: Decision, attempts: list[Decision]) -> None:
        """Forward with fallback; a client that goes away cancels whatever is under way
        (waiting for a head's first byte included) and so closes the upstream request."""
        task = asyncio.current_task()
        assert task is not None
        gone: dict[str, bool] = {"gone": False}
        watcher: list[asyncio.Task[None]] = []

        def watch() -> None:
            watcher.append(asyncio.ensure_future(_watch_disconnect(receive, task, gone)))

        # A timer costs far less than a task: most requests to a fast head are over before
        # it fires, and any that lasts longer is watched from then on.
        timer = asyncio.get_running_loop().call_later(WATCH_AFTER_S, watch)
        try:
            await self._attempts(scope, send, req, first, attempts, gone)
        except asyncio.CancelledError:
            if not gone["gone"]:
                raise
            task.uncancel()  # our own cancellation: the client left; nothing more to send
        finally:
            timer.cancel()
            for waiting in watcher:
                waiting.cancel()

    async def _attempts(self, scope: Scope, send: Send, req: ChatRequest, first: Decision,
                        attempts: list[Decision], gone: dict[str, bool]) -> None:
        headers = _client_headers(scope)
        failures: dict[str, str] = {}
        kinds: list[str] = []
        decision: Decision | None = first
        while decision is not None:
            attempts.append(decision)
            self.telemetry.decided(decision)
            start = time.perf_counter()
            try:
                upstream = await self.forwarder.open(
                    decision.route.head.url + CHAT_PATH, req.body,
                    headers + route_headers(decision))
            except ForwardError as exc:
                self._finish(decision, Outcome(seconds=time.perf_counter() - start,
                                               error=exc.kind))
                failures[decision.signature] = str(exc)
                kinds.append(exc.kind)
                decision = self.router.fallback(decision)
                continue
            await self._relay(decision, upstream, send, start, gone)
            return
        rate_limited = bool(kinds) and all(k == "http_429" for k in kinds)
        status, code = (429, "rate_limited") if rate_limited else (503, "no_route_available")
        await send_error(send, status, f"every route for {req.model!r} failed before its "
                         "first byte", code, routes=failures)

    async def _relay(self, decision: Decision, upstream: UpstreamResponse, send: Send,
                     start: float, gone: dict[str, bool]) -> None:
        if 400 <= upstream.status < 500:
            self.router.cancel(decision)  # the client's own mistake says nothing of the route
            await self._pipe_plain(decision, upstream, send)
            return
        meter = TokenMeter(streaming=_is_sse(upstream.headers))
        state: dict[str, Any] = {"first": None, "error": ""}
        try:
            await send({"type": "http.response.start", "status": upstream.status,
                        "headers": _with_ours(upstream.headers, decision)})
            await self._pump(upstream, send, meter, state)
        except OSError:
            gone["gone"] = True
        finally:
            upstream.close()
            self._finish_relay(decision, meter, state, start, gone["gone"])
        if not gone["gone"]:
            await self._end_body(send, meter, state)

    async def _pump(self, upstream: UpstreamResponse, send: Send, meter: TokenMeter,
                    state: dict[str, Any]) -> None:
        try:
            async for chunk in upstream.chunks():
                if state["first"] is None:
                    state["first"] = time.perf_counter()
                meter.feed(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except ForwardError as exc:
            state["error"] = exc.kind
        state["last"] = time.perf_counter()

    def _finish_relay(self, decision: Decision, meter: TokenMeter, state: dict[str, Any],
                      start: float, gone: bool) -> None:
        """Record a relayed attempt; a client that left before any byte says nothing of the
        route, one that left mid-way leaves a sample of what was delivered until then."""
        last = state.get("last") or time.perf_counter()
        first = state["first"]
        if gone and first is None:
            self.router.cancel(decision)
            return
        outcome = Outcome(meter.completion_tokens, last - start,
                          (first - start) if first is not None else last - start,
                          state["error"])
        self._finish(decision, outcome)

    @staticmethod
    async def _end_body(send: Send, meter: TokenMeter, state: dict[str, Any]) -> None:
        tail = b""
        if state["error"] and meter.streaming:
            tail = sse_error_event("the route's head failed mid-stream; partial response")
        with contextlib.suppress(OSError):
            await send({"type": "http.response.body", "body": tail, "more_body": False})

    async def _pipe_plain(self, decision: Decision, upstream: UpstreamResponse,
                          send: Send) -> None:
        try:
            await send({"type": "http.response.start", "status": upstream.status,
                        "headers": _with_ours(upstream.headers, decision)})
            async for chunk in upstream.chunks():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (ForwardError, OSError):
            pass
        finally:
            upstream.close()

    # -- annotate mode ----------------------------------------------------------------
    async def _annotate(self, scope: Scope, receive: Receive, send: Send, req: ChatRequest,
                        first: Decision, attempts: list[Decision]) -> None:
        decision: Decision | None = first
        while decision is not None:
            attempts.append(decision)
            self.telemetry.decided(decision)
            attempt = _Attempt(decision, send)
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
        state["meshroute"] = {"signature": decision.signature, "mode": decision.mode,
                              "plan": decision.route.plan(), "attempt": decision.attempt}
        return {**scope, "headers": headers + route_headers(decision), "state": state}


async def _watch_disconnect(receive: Receive, task: asyncio.Task[Any],
                            gone: dict[str, bool]) -> None:
    """Wait for the client to leave, then cancel the task serving it."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone["gone"] = True
            task.cancel()
            return


class _PassThrough(Exception):
    def __init__(self, body: bytes) -> None:
        super().__init__("pass through")
        self.body = body


class _Attempt:
    """Wraps the app's send for one annotated attempt: adds headers, measures, and holds a
    5xx/429 answer back so that the middleware can fall back before the client sees a byte."""

    def __init__(self, decision: Decision, send: Send) -> None:
        self.decision, self._send = decision, send
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
            self.started = True
        elif kind == "http.response.body":
            if self.failed_early:
                self._held.append(message)
                return
            body = message.get("body", b"")
            now = time.perf_counter()
            if body and self.first is None:
                self.first = now
            if self.meter is not None:
                self.meter.feed(body)
            if not message.get("more_body", False):
                self.last = now
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
        if self._held:
            first = self._held[0]
            self._held[0] = {**first, "headers": _with_ours(first.get("headers", ()),
                                                            self.decision)}
            for message in self._held:
                await self._send(message)
            return
        await send_error(self._send, 503, f"every route for {model!r} failed before its "
                         "first byte", "no_route_available", _response_headers(self.decision))
