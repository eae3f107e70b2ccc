"""Annotate mode: the wrapped app serves each attempt itself, told the plan in headers and in
scope["state"]["meshroute"]; its answer is measured on the way to the client, and a 5xx/429
is held back so that the next route can be tried before the client sees a byte. The app runs
within the request's deadline (chat.attempts): cut at it, a stream ends with an SSE error
event and a JSON answer is left incomplete (the server aborts the connection)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import replace

from starlette.types import ASGIApp, Message, Scope

from meshroute_middleware.chat.attempts import Exchange, Failed, Measurement, retry_at
from meshroute_middleware.chat.headers import annotated, with_ours
from meshroute_middleware.chat.watchdog import Watchdog
from meshroute_middleware.core import Decision
from meshroute_middleware.forwarding.measure import sse_error_event
from meshroute_middleware.http.request import replay


class AnnotateMode:
    """Serves a chat request through the wrapped app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._watchdog = Watchdog()  # the deadline: one timer for every request under way

    async def serve(self, ex: Exchange, first: Decision) -> None:
        """Run the app once per attempt; if every route failed, the client gets the last
        failing answer as it was (or an error if the app raised)."""
        self._watchdog.watch(ex, deadline=True)
        try:
            last, failed = await ex.attempts.run(first, self._attempt, ex)
        finally:
            self._watchdog.forget(ex)
        if failed is None:
            return
        ex.started = True
        if not failed.held:
            await ex.attempts.send_exhausted(ex.send, last, failed)
            return
        held = list(failed.held)
        headers = with_ours(held[0].get("headers", ()), last)
        if held[0].get("status") == 429:  # the soonest any route's 429 said, parsed and
            # bounded (chat.attempts.retry_at): not the last one's header as it was
            headers = [h for h in headers if h[0].lower() != b"retry-after"]
            retry = ex.attempts.retry_after_s()
            if retry is not None:
                headers.append((b"retry-after", str(retry).encode()))
        held[0] = {**held[0], "headers": headers}
        for message in held:
            await ex.send(message)

    async def _attempt(self, decision: Decision, measurement: Measurement,
                       ex: Exchange) -> Failed | None:
        send = _AnnotatedSend(decision, measurement, ex)
        try:
            await self.app(_annotated(ex.scope, decision), replay(ex.req.body, ex.receive),
                           send.send)
        except asyncio.CancelledError:
            if not ex.expired or ex.task is None:
                raise
            ex.task.uncancel()  # the watchdog's, at the deadline: not a cancellation of ours
            return await _cut(decision, measurement, send, ex)
        except Exception:
            if send.started:
                ex.attempts.record(decision, measurement.outcome("app_error"))
                raise
            if send.failed is None:
                return Failed("app_error", "the app raised an error")
        if send.failed is not None:
            return send.held_failure(send.failed)
        ex.attempts.settle(decision, measurement, status=send.status, gone=send.gone)
        return None


async def _cut(decision: Decision, m: Measurement, send: _AnnotatedSend,
               ex: Exchange) -> Failed | None:
    """The deadline ran out while the app served the attempt."""
    if send.failed is not None:
        return send.held_failure(send.failed)
    if not send.started:
        return Failed("timeout", "no answer within the request's deadline")
    if m.last is not None:  # the answer was complete: only the app's epilogue was cut
        ex.attempts.settle(decision, m, status=send.status, gone=send.gone)
        return None
    m.last = time.perf_counter()
    ex.attempts.record(decision, m.outcome("timeout"))
    if m.meter is not None and m.meter.streaming and not send.gone:
        with contextlib.suppress(OSError):
            await ex.send({"type": "http.response.body", "more_body": False,
                           "body": sse_error_event("the request's deadline ran out; "
                                                   "partial response")})
    return None


def _retry_header(start: Message) -> float | None:
    """When an app's 429 (its `http.response.start`) says to come back, if it says."""
    for key, value in start.get("headers", ()):
        if key.lower() == b"retry-after":
            return retry_at(value)
    return None


def _annotated(scope: Scope, decision: Decision) -> Scope:
    """The app's scope: the plan in headers (any the client sent are dropped) and in state."""
    headers = annotated(scope, decision)
    state = dict(scope.get("state") or {})
    state["meshroute"] = {"signature": decision.signature, "mode": decision.mode,
                          # the app's own copy: the route's plan must not be mutable by it
                          "plan": decision.route.plan(), "attempt": decision.attempt}
    return {**scope, "headers": headers, "state": state}


class _AnnotatedSend:
    """Wraps the app's send for one attempt: adds our headers, measures, and holds a
    5xx/429 answer back."""

    __slots__ = ("_ex", "decision", "failed", "gone", "held", "m", "started", "status")

    def __init__(self, decision: Decision, m: Measurement, ex: Exchange) -> None:
        self.decision, self.m, self._ex = decision, m, ex
        self.status: int | None = None
        self.started = False
        self.gone = False
        self.failed: Failed | None = None
        self.held: list[Message] = []

    def held_failure(self, failed: Failed) -> Failed:
        """`failed` with the answer held back (its start and body as the app sent them)."""
        return replace(failed, held=tuple(self.held))

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self.status = int(message["status"])
            if self.status >= 500 or self.status == 429:
                self.failed = Failed("http_429" if self.status == 429 else "http_5xx",
                                     f"the app answered {self.status}",
                                     retry_at=_retry_header(message) if self.status == 429
                                     else None)
                self.held.append(message)
                return
            headers = with_ours(message.get("headers", ()), self.decision)
            self.m.answer(headers)
            message = {**message, "headers": headers}
            self.started = self._ex.started = True
        elif kind == "http.response.body":
            if self.failed is not None:
                self.held.append(message)
                return
            body = message.get("body", b"")
            now = time.perf_counter()
            if body and self.m.first is None:
                self.m.first = now
            if not message.get("more_body", False):
                self.m.last = now
        else:
            body = b""
        try:
            await self._ex.send(message)
        except OSError:
            self.gone = True
            raise
        if kind == "http.response.body" and self.m.meter is not None:
            self.m.meter.feed(body)  # counted once on its way: the client does not wait
