"""Forward mode: each attempt goes to the chosen route's head, and the answer streams back to
the client untouched while it is measured.

A route's learned first-byte deadline (chat/deadlines.py) bounds the wait for its head, once
the route is warm: a hang costs about the route's normal worst case, then the next route is
tried. The request's deadline (chat.attempts) bounds the wait for a head and every chunk after it:
a client that got nothing yet gets a 504 JSON error, a stream ends with an SSE error event.
A non-stream answer that breaks off (the head died, stalled past the idle timeout, or the
deadline ran out) is never passed off as complete: the client's connection is aborted
without the final chunk, and the attempt is recorded as failed."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from typing import Literal

from meshroute_middleware.chat.attempts import Attempts, Exchange, Failed, Measurement, retry_at
from meshroute_middleware.chat.continuation import Transcript, next_continuing
from meshroute_middleware.chat.deadlines import FirstByteDeadlines, GapDeadlines
from meshroute_middleware.chat.failover import Broke, GoingOn, fail_over
from meshroute_middleware.chat.gather import Gathering, gathers
from meshroute_middleware.chat.headers import (
    Headers,
    forwardable,
    from_node,
    is_sse,
    plan_headers,
)
from meshroute_middleware.chat.hedge import Hedging
from meshroute_middleware.chat.keyring import NodeSecrets
from meshroute_middleware.chat.relay import broken_text, cut_by_us, relay
from meshroute_middleware.chat.spend import ClientSpend
from meshroute_middleware.chat.watchdog import Watchdog
from meshroute_middleware.core import Decision, Router
from meshroute_middleware.core.contracts.load import LOAD_HEADER, parse_held
from meshroute_middleware.core.kinds import ErrorKind
from meshroute_middleware.forwarding.client import (
    Forwarder,
    ForwardError,
    HeldAnswer,
    UpstreamResponse,
)
from meshroute_middleware.forwarding.measure import sse_error_event
from meshroute_middleware.http.request import CHAT_PATH

__all__ = ["CHAT_PATH", "ForwardMode"]
log = logging.getLogger("meshroute.forward")
SIZE_STATUSES = frozenset({400, 413})
MAX_REFUSAL_BYTES = 64 * 1024  # of a head's 400 read to see whether it refuses the size
# what a server's refusal of a request's size says: OpenAI's and vLLM's `max_tokens` /
# context-length messages, llama.cpp's "exceeds the available context size" and
# "n_predict", Anthropic's "prompt is too long"
SIZE_REFUSAL = re.compile(rb"max_(?:completion_)?tokens|context[_ ](?:length|size|window)"
                          rb"|maximum context|too many tokens|prompt is too long|n_predict",
                          re.I)


class ForwardMode:
    """Serves a chat request by forwarding it; a client that goes away cancels whatever is
    under way (waiting for a head's first byte included) and so the upstream request."""

    def __init__(self, forwarder: Forwarder, *,
                 forward_headers: frozenset[bytes] = frozenset(),
                 node_keys: NodeSecrets | None = None, size_falls_over: bool = False,
                 hedging: Hedging | None = None, spend: ClientSpend | None = None) -> None:
        self.forwarder = forwarder
        self.spend = spend  # a limited client's continuation is reserved (chat/failover.py)
        self.size_falls_over = size_falls_over
        self.forward_headers = forward_headers  # credentials the operator lets through
        self.node_keys = node_keys or {}  # [[node_keys]]: a node's own key, for it alone
        self._watchdog = Watchdog()
        self.deadlines = FirstByteDeadlines()  # learned per route (issue 34)
        self.gaps = GapDeadlines(getattr(forwarder, "idle_s", None))  # between two chunks
        self.hedging = hedging  # hedged first tokens (chat/hedge.py), when configured

    async def serve(self, ex: Exchange, first: Decision) -> None:
        """Forward with fallback; send the client an error if every route failed."""
        task = self._watchdog.watch(ex)
        if self.hedging is not None:
            ex.attempts.hedge = self.hedging.for_request(ex.req.model, ex)
        gathered = gathers(ex.req, first)
        if gathered is not None:  # not streamed: gathered from a stream, to be continued
            ex.req.body, ex.send = gathered, Gathering(ex.send, ex.req.kind)
        try:
            last, failed = await ex.attempts.run(first, self.attempt, ex)
            if failed is not None and not ex.started:
                await ex.attempts.send_exhausted(ex.send, last, failed)
        except asyncio.CancelledError:
            if not ex.gone:
                raise
            task.uncancel()  # our own cancellation: the client left; nothing more to send
        finally:
            self._watchdog.forget(ex)

    async def attempt(self, decision: Decision, measurement: Measurement,
                      ex: Exchange) -> Failed | None:
        """One attempt at `decision`'s head (at its request kind's path), within the
        request's deadline. With `size_falls_over` (a chain's mesh entries, issue 33), a
        head's 400 or 413 refusing the request's size (`max_tokens`, the context) is a
        `context` failure the chain falls over from, not the client's answer."""
        upstream = await self._open(decision, measurement, ex, ex.req.body)
        if isinstance(upstream, Failed):
            return upstream
        if self.size_falls_over and upstream.status in SIZE_STATUSES:
            refused = await _size_refusal(upstream, ex)
            if isinstance(refused, Failed):
                return refused
            upstream = refused
        await self._relay(decision, measurement, upstream, ex, ex.attempts)
        return None

    async def _open(self, decision: Decision, measurement: Measurement, ex: Exchange,
                    body: bytes) -> UpstreamResponse | Failed:
        """Send `body` to `decision`'s head; its answer once its head is in, or why not."""
        req = ex.req
        reached, req.reached = req.reached, decision.signature  # charged its prompt from here
        signature = decision.signature
        learned = self.deadlines.deadline_s(signature)
        cut_at = ex.attempts.cut_at(learned)
        try:
            async with asyncio.timeout_at(cut_at):
                upstream = await self.forwarder.open(
                    decision.route.head.url + req.path, body, self._headers(decision, ex))
        except ForwardError as exc:
            if exc.kind == "connect":  # never reached the head
                req.reached = reached
            return Failed(exc.kind, str(exc), retry_at=retry_at(exc.retry_after))
        except TimeoutError:
            if cut_at < ex.attempts.deadline:  # the route's own learned deadline
                self.deadlines.forget(signature)
                return Failed("timeout", f"no first byte within the route's learned "
                                         f"{learned:.2f} s")
            return Failed("timeout", "no answer within the request's deadline")
        self.deadlines.observe(signature, time.perf_counter() - measurement.start)
        return upstream

    async def continuing(self, decision: Decision, measurement: Measurement,
                         going: GoingOn) -> Failed | None:
        """An attempt that continues a stream another route began (chat/continuation.py):
        its answer is spliced into the stream the client is reading. A route that refuses
        the continuation (a 4xx: a server that takes no assistant prefill) is passed over
        without a record: it says nothing of the route's speed."""
        ex = going.ex
        upstream = await self._open(decision, measurement, ex, going.body)
        if isinstance(upstream, Failed):
            return upstream
        if upstream.status != 200 or not is_sse(upstream.headers):
            upstream.close()
            return Failed("context", f"the route did not continue the answer "
                                     f"({upstream.status})", code="capability")
        assert going.transcript.splice is not None
        going.transcript.splice.going_on(decision.signature)
        await self._relay(decision, measurement, upstream, ex, ex.attempts, going.transcript)
        return None

    def _headers(self, decision: Decision, ex: Exchange) -> Headers:
        """What the head receives: the client's forwardable headers and the plan; with a
        `[[node_keys]]` key for this head at this URL, its own bearer key in place of any
        authorization the client's headers carried."""
        headers = forwardable(ex.scope, self.forward_headers) + plan_headers(decision)
        head = decision.route.head
        bound = self.node_keys.get(head.node_id) if self.node_keys else None
        if bound is None or bound[0] != head.url:
            return headers
        return [*(h for h in headers if h[0] != b"authorization"),
                (b"authorization", b"Bearer " + bound[1].reveal().encode())]

    async def _relay(self, decision: Decision, m: Measurement, upstream: UpstreamResponse,
                     ex: Exchange, attempts: Attempts,
                     transcript: Transcript | None = None) -> None:
        """Stream the head's answer to the client, measuring it; then settle the attempt. A
        stream that may be continued (`transcript`: given when it continues another route's)
        goes on on the next route when this one fails mid-way (`_failover`)."""
        going_on = transcript is not None
        if 400 <= upstream.status < 500 and not going_on:
            attempts.settle(decision, m, status=upstream.status)
            await _pipe_plain(decision, upstream, ex)
            return
        send = ex.send
        meter = m.answer(upstream.headers)
        note_node_load(attempts.router, decision, upstream.headers)
        if transcript is None and meter.streaming and ex.req.continues:
            transcript = Transcript(ex.req.kind)
        error: ErrorKind | Literal[""] = ""
        try:
            if not going_on:
                ex.started = True
                await send({"type": "http.response.start", "status": upstream.status,
                            "headers": from_node(upstream.headers, decision)})
            if meter.streaming:  # a stream's gaps are timed and learned (chat/deadlines.py)
                paced = self.gaps.paced(decision.signature, upstream)
                error = await relay(send, paced, attempts.deadline, m, transcript)
                paced.end(error)
            else:  # a whole answer's body chunks say nothing of a route's gaps
                error = await relay(send, upstream.chunks(), attempts.deadline, m, transcript)
        except OSError:
            ex.gone = True
        except BaseException as exc:  # cancelled (the client left, a hedge won) or a bug
            upstream.close()
            m.last = time.perf_counter()
            if cut_by_us(ex.scope, exc):  # stopping: our cut, not the route's doing
                attempts.router.cancel(decision)
            else:
                attempts.settle(decision, m, error,
                                gone=ex.gone or isinstance(exc, asyncio.CancelledError))
            raise
        upstream.close()
        m.last = time.perf_counter()
        if error and not meter.streaming and not ex.gone:
            # A broken JSON answer must not end like a complete one: no final chunk, so the
            # server aborts the client's connection (chunked: no terminator; else short).
            log.warning("meshroute: %s broke off mid-answer (%s): aborting the client's "
                        "connection", decision.signature, error)
            attempts.settle(decision, m, error, gone=ex.gone)
            return
        settled = False
        if error and transcript is not None and not ex.gone:
            attempts.settle(decision, m, error)
            settled = True
            if await self._failover(decision, m, ex, transcript, error):
                return
        if not ex.gone:
            # The client's response ends before the bookkeeping: a stream's last chunk is
            # not held back by recording it.
            held = b"" if transcript is None or error else transcript.flush()
            tail = held + (sse_error_event(broken_text(error))
                           if error and meter.streaming else b"")
            try:
                await send({"type": "http.response.body", "body": tail, "more_body": False})
            except OSError:
                ex.gone = True
            except BaseException:
                if not settled:
                    attempts.settle(decision, m, error, gone=ex.gone)
                raise
        if not settled:
            attempts.settle(decision, m, error, gone=ex.gone)

    async def _failover(self, decision: Decision, m: Measurement, ex: Exchange,
                        transcript: Transcript, error: ErrorKind) -> bool:
        """`decision`'s stream broke off (`error`) after content reached the client: go on
        on the next route that can continue it (chat/failover.py's rule). True when the
        stream was ended there; False when it cannot be continued."""
        attempts = ex.attempts
        done = m.meter.completion_tokens if m.meter is not None else 0

        async def following() -> Decision | None:
            return next_continuing(attempts.router, decision)

        return await fail_over(
            ex, transcript, Broke(decision.signature, error, done, ex.req.body), following,
            self.continuing, sse_error_event(broken_text(error)),
            announce=lambda nxt: attempts.telemetry.failover(decision, nxt, error),
            spend=self.spend)


async def _size_refusal(upstream: UpstreamResponse, ex: Exchange) -> UpstreamResponse | Failed:
    """A head's 400/413 read whole (bounded): a `context` Failed when it names `max_tokens`
    or the context, else the same answer to relay as it came."""
    body = bytearray()
    try:
        async with asyncio.timeout_at(ex.attempts.deadline):
            async for chunk in upstream.chunks():
                body += chunk
                if len(body) > MAX_REFUSAL_BYTES:
                    break
    except (ForwardError, TimeoutError):
        pass
    upstream.close()
    if SIZE_REFUSAL.search(body):
        return Failed("context", f"the head refused the request's size ({upstream.status})")
    return HeldAnswer(upstream.status, upstream.headers, bytes(body))
_LOAD_KEY = LOAD_HEADER.encode()


def note_node_load(router: Router, decision: Decision, headers: Headers) -> None:
    """The head's `x-meshroute-load`, when it sends one: the requests it holds from every
    tracker, which the router counts beside its own (core/node_load.py)."""
    for key, value in headers:
        if key.lower() == _LOAD_KEY:
            held = parse_held(value)
            if held is not None:
                router.note_load(decision.route.head.node_id, held)
            return


async def _pipe_plain(decision: Decision, upstream: UpstreamResponse, ex: Exchange) -> None:
    """Relay a head's 4xx as it is, unmeasured: the client's own mistake."""
    try:
        ex.started = True
        await ex.send({"type": "http.response.start", "status": upstream.status,
                       "headers": from_node(upstream.headers, decision)})
        async for chunk in upstream.chunks():
            await ex.send({"type": "http.response.body", "body": chunk, "more_body": True})
        await ex.send({"type": "http.response.body", "body": b"", "more_body": False})
    except (ForwardError, OSError):
        pass
    finally:
        upstream.close()
