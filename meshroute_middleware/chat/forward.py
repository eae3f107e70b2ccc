"""Forward mode: each attempt goes to the chosen route's head, and the answer streams back to
the client untouched while it is measured."""

from __future__ import annotations

import asyncio
import time

from ..core import Decision
from ..forwarding import Forwarder, ForwardError, UpstreamResponse
from ..measure import sse_error_event
from .attempts import Attempts, Exchange, Failed, Measurement
from .headers import forwardable, plan_headers, with_ours
from .watchdog import Watchdog

CHAT_PATH = "/v1/chat/completions"


class ForwardMode:
    """Serves a chat request by forwarding it; a client that goes away cancels whatever is
    under way (waiting for a head's first byte included) and so the upstream request."""

    def __init__(self, forwarder: Forwarder) -> None:
        self.forwarder = forwarder
        self._watchdog = Watchdog()

    async def serve(self, ex: Exchange, first: Decision) -> None:
        """Forward with fallback; send the client an error if every route failed."""
        task = self._watchdog.watch(ex)
        try:
            last, failed = await ex.attempts.run(first, self._attempt, ex)
            if failed is not None:
                await ex.attempts.send_exhausted(ex.send, last)
        except asyncio.CancelledError:
            if not ex.gone:
                raise
            task.uncancel()  # our own cancellation: the client left; nothing more to send
        finally:
            self._watchdog.forget(ex)

    async def _attempt(self, decision: Decision, measurement: Measurement,
                       ex: Exchange) -> Failed | None:
        try:
            upstream = await self.forwarder.open(
                decision.route.head.url + CHAT_PATH, ex.req.body,
                forwardable(ex.scope) + plan_headers(decision))
        except ForwardError as exc:
            return Failed(exc.kind, str(exc))
        await self._relay(decision, measurement, upstream, ex, ex.attempts)
        return None

    async def _relay(self, decision: Decision, m: Measurement, upstream: UpstreamResponse,
                     ex: Exchange, attempts: Attempts) -> None:
        """Stream the head's answer to the client, measuring it; then settle the attempt."""
        if 400 <= upstream.status < 500:
            attempts.settle(decision, m, status=upstream.status)
            await _pipe_plain(decision, upstream, ex)
            return
        send = ex.send
        meter = m.answer(upstream.headers)
        error = ""
        try:
            ex.started = True
            await send({"type": "http.response.start", "status": upstream.status,
                        "headers": with_ours(upstream.headers, decision)})
            try:
                async for chunk in upstream.chunks():
                    if m.first is None:
                        m.first = time.perf_counter()
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
                    meter.feed(chunk)  # counted once on its way: the client does not wait
            except ForwardError as exc:
                error = exc.kind
        except OSError:
            ex.gone = True
        except BaseException:  # cancelled (the client left) or a bug: settle, then go on
            upstream.close()
            m.last = time.perf_counter()
            attempts.settle(decision, m, error, gone=ex.gone)
            raise
        upstream.close()
        m.last = time.perf_counter()
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
                attempts.settle(decision, m, error, gone=ex.gone)
                raise
        attempts.settle(decision, m, error, gone=ex.gone)


async def _pipe_plain(decision: Decision, upstream: UpstreamResponse, ex: Exchange) -> None:
    """Relay a head's 4xx as it is, unmeasured: the client's own mistake."""
    try:
        ex.started = True
        await ex.send({"type": "http.response.start", "status": upstream.status,
                       "headers": with_ours(upstream.headers, decision)})
        async for chunk in upstream.chunks():
            await ex.send({"type": "http.response.body", "body": chunk, "more_body": True})
        await ex.send({"type": "http.response.body", "body": b"", "more_body": False})
    except (ForwardError, OSError):
        pass
    finally:
        upstream.close()
