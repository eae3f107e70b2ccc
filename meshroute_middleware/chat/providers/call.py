"""A provider attempt: one POST of `{base_url}/chat/completions` (`/embeddings`,
`/completions`: the request kind's path) with one key.

The body carries the upstream's own model id, the headers `Authorization: Bearer <key>` and
the client's `accept`, no other header of the client's (its Authorization least of all).
A provider model with `api = "anthropic"` is called at `{base_url}/messages` instead, with
`x-api-key: <key>`, the client's `anthropic-version` (else ANTHROPIC_VERSION) and
`anthropic-beta`: a /v1/messages request goes untranslated and its answer is relayed as it is;
any other request goes translated to Messages and its answer comes back as chat completions
(chat/dialects/wire/anthropic_chat.py). Either way it is measured on the bytes the route sent.
Nothing reaches the client before the first content byte of an answer: until then a failure
(429, 5xx, timeout, connect, a stream that breaks before its first chunk) is returned, for
the chain to try the next route. After it, a broken or cut stream ends with an SSE error
event. Every wait is bounded by the first-byte timeout, the chain's budget and the request's
deadline; a head silent between two chunks is the forwarder's idle timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Callable, Mapping

from meshroute_middleware.chat.dialects.wire.anthropic_chat import (
    ChatStream,
    chat_completion,
    chat_error,
)
from meshroute_middleware.chat.headers import is_sse
from meshroute_middleware.chat.keyring import Secret
from meshroute_middleware.chat.providers.messages_api import (
    broken_event,
    messages_error,
    messages_headers,
    native_of,
    request_payload,
    reverse,
)
from meshroute_middleware.chat.providers.outcomes import ChainOutcomes
from meshroute_middleware.chat.providers.request import ChainRequest, header
from meshroute_middleware.chat.scrub import Scrubber, UndecodableError, decode_body, decode_stream
from meshroute_middleware.core.providers.exhaustion import PassedOver
from meshroute_middleware.core.providers.keys import REVOKING_STATUSES, parse_retry_after
from meshroute_middleware.core.providers.router import ChainAttempt, ProviderRouter
from meshroute_middleware.core.providers.scoring import OutcomeKind
from meshroute_middleware.forwarding.client import (
    Forwarder,
    ForwardError,
    ForwardTimeouts,
    UpstreamResponse,
)
from meshroute_middleware.forwarding.measure import TokenMeter
from meshroute_middleware.http.errors import error_body

log = logging.getLogger("meshroute.providers")
MAX_BODY_BYTES = 32 * 1024 * 1024  # a non-streamed answer held to read its usage
MAX_HELD_BYTES = 64 * 1024  # a stream's start held back while it carries no content
# the first content of a stream: chat completions' text, reasoning or tool call, a completions
# choice's `text`, Messages' first delta
_CONTENT = re.compile(rb'"(?:content|text|reasoning_content|reasoning)"\s*:\s*"(?!")'
                      rb'|"tool_calls"\s*:\s*\[\s*\{|data: \[DONE\]|event: content_block_delta')
_TOTAL_TOKENS = re.compile(rb'"total_tokens"\s*:\s*(\d+)')
_INPUT_TOKENS = re.compile(rb'"input_tokens"\s*:\s*(\d+)')  # Messages' usage
_OUTPUT_TOKENS = re.compile(rb'"output_tokens"\s*:\s*(\d+)')
_CONTEXT_REFUSAL = re.compile(rb"context[_ ]length|maximum context|too many tokens"
                              rb"|prompt is too long", re.I)
_PASS_ON = frozenset({b"content-type", b"openai-processing-ms", b"x-request-id",
                      b"request-id"})
_REASONS = frozenset({"http_429", "http_5xx", "timeout", "connect"})  # else: http_5xx


def failure_reason(kind: str) -> str:
    """The ProviderRouter's failure reason for a forwarding error kind."""
    return kind if kind in _REASONS else "http_5xx"


class ProviderCall:
    """Makes provider attempts for the chain."""

    def __init__(self, providers: ProviderRouter, secrets: Mapping[str, tuple[Secret, ...]],
                 forwarder: Forwarder, outcomes: ChainOutcomes, timeouts: ForwardTimeouts,
                 clock: Callable[[], float]) -> None:
        self.providers, self.secrets, self.forwarder = providers, secrets, forwarder
        self.outcomes, self.timeouts, self.clock = outcomes, timeouts, clock
        self._scrubber = Scrubber(s.reveal() for keys in secrets.values() for s in keys)

    async def __call__(self, cr: ChainRequest, got: ChainAttempt) -> PassedOver | None:
        """Try `got`'s key; None once answered (or relayed), else why it was passed over."""
        c = got.candidate
        assert c.provider is not None and got.key is not None
        secret = self.secrets[c.provider.name][got.key - 1]
        payload = request_payload(cr, c)
        body = json.dumps({**{k: v for k, v in payload.items() if k != "route"},
                           "model": c.upstream_model}).encode()
        if c.model is None or c.model.api == "openai":
            headers = [(b"content-type", b"application/json"),
                       (b"authorization", b"Bearer " + secret.reveal().encode())]
            url = c.provider.base_url.rstrip("/") + cr.ex.req.path.removeprefix("/v1")
        else:
            headers = messages_headers(cr, secret.reveal())
            url = c.provider.base_url.rstrip("/") + "/messages"
        if (accept := header(cr.ex.scope, b"accept")) is not None:
            headers.append((b"accept", accept.encode("latin-1")))
        self.outcomes.begin(got, cr.tally.chain, len(cr.tally.tried) - 1, cr.objective)
        try:
            return await self._attempt(cr, got, url, body, headers)
        except asyncio.CancelledError:  # the client left: settle the reservation, blame nobody
            self.outcomes.cancelled(got)
            raise
        finally:
            self.outcomes.end(got)

    def _budget(self, cr: ChainRequest) -> float:
        return min(self.timeouts.first_byte_s, cr.time_to_deadline(),
                   self.providers.time_left(cr.started, self.clock()))

    async def _attempt(self, cr: ChainRequest, got: ChainAttempt, url: str, body: bytes,
                       headers: list[tuple[bytes, bytes]]) -> PassedOver | None:
        budget = self._budget(cr)
        sent = time.perf_counter()
        req = cr.ex.req
        reached, req.reached = req.reached, got.route  # sent: charged its prompt from here
        try:
            upstream = await asyncio.wait_for(self.forwarder.open(url, body, headers), budget)
        except TimeoutError:
            return self.outcomes.failed(got, "timeout", cr.session)
        except ForwardError as exc:
            if exc.kind == "connect":  # never reached the provider
                req.reached = reached
            if exc.kind == "http_429":
                return self.outcomes.record(
                    got, OutcomeKind.RATE_LIMITED, session=cr.session,
                    retry_after_s=parse_retry_after(exc.retry_after, self.clock()))
            return self.outcomes.failed(got, failure_reason(exc.kind), cr.session)
        try:
            if upstream.status in REVOKING_STATUSES:
                log.warning("providers: %s answered %d: key %s taken out of rotation until "
                            "cleared or restarted", got.route, upstream.status, got.key)
                return self.outcomes.key_refused(got, upstream.status)
            if upstream.status >= 400:
                return await self._client_error(cr, got, upstream, budget)
            if is_sse(upstream.headers):
                return await self._stream(cr, got, upstream, sent, budget)
            return await self._whole(cr, got, upstream, sent, budget)
        finally:
            upstream.close()

    async def _read_all(self, upstream: UpstreamResponse, budget: float) -> bytes:
        async def read() -> bytes:
            out = bytearray()
            async for chunk in upstream.chunks():
                out += chunk
                if len(out) > MAX_BODY_BYTES:
                    raise ForwardError("stream", "the answer is larger than meshroute holds")
            return decode_body(upstream.headers, bytes(out))  # compressed: read before scrubbing
        return await asyncio.wait_for(read(), budget)

    async def _client_error(self, cr: ChainRequest, got: ChainAttempt, upstream: UpstreamResponse,
                            budget: float) -> PassedOver | None:
        """A 4xx: the client's own mistake, relayed; a context-length refusal falls over."""
        try:
            body = await self._read_all(upstream, budget)
        except (ForwardError, TimeoutError):
            body = b""
        except UndecodableError as exc:  # never relayed as it came: our own error instead
            text = f"the provider's error answer could not be read: {exc}"
            body = (error_body(upstream.status, text, "upstream_undecodable")
                    if native_of(cr, got.candidate) is None
                    else messages_error(upstream.status, text))
        if upstream.status in (400, 413) and _CONTEXT_REFUSAL.search(body):
            return self.outcomes.record(got, OutcomeKind.CLIENT_ERROR, reason="context",
                                        session=cr.session)
        if reverse(cr, got.candidate):
            body = chat_error(upstream.status, body)
        self.outcomes.record(got, OutcomeKind.CLIENT_ERROR, session=cr.session)
        await self._answer(cr, upstream, got, self._scrubber.scrub(body))
        return None

    async def _whole(self, cr: ChainRequest, got: ChainAttempt, upstream: UpstreamResponse,
                     sent: float, budget: float) -> PassedOver | None:
        """A JSON answer: held whole (its usage settles the reservation), then sent."""
        try:
            body = await self._read_all(upstream, budget)
        except TimeoutError:
            return self.outcomes.failed(got, "timeout", cr.session)
        except ForwardError:
            return self.outcomes.failed(got, "connect", cr.session)
        except UndecodableError:  # a body it cannot have meant: a bad answer, not a cut
            return self.outcomes.failed(got, "upstream_invalid", cr.session)
        done = time.perf_counter()
        meter = TokenMeter(streaming=False)
        meter.feed(body)
        answer = body
        if reverse(cr, got.candidate):
            try:
                answer = json.dumps(chat_completion(json.loads(body),
                                                    got.candidate.upstream_model)).encode()
            except (ValueError, UnicodeDecodeError, AttributeError):
                return self.outcomes.failed(got, "upstream_invalid", cr.session)
        seconds = max(done - sent, 1e-6)
        # an embeddings answer is measured in inputs/s, recorded in the embeddings lane's
        # own statistics (docs/architecture.md, "Statistics per request kind")
        inputs = cr.ex.req.inputs
        done_units = meter.completion_tokens if inputs is None else inputs
        self.outcomes.record(got, OutcomeKind.SUCCESS, used_tokens=total_tokens(body),
                             completion_tokens=done_units,
                             tokens_per_s=self.outcomes.tps(done_units, seconds),
                             ttfb_ms=seconds * 1000, session=cr.session)
        await self._answer(cr, upstream, got, self._scrubber.scrub(answer))
        return None

    async def _stream(self, cr: ChainRequest, got: ChainAttempt, upstream: UpstreamResponse,
                      sent: float, budget: float) -> PassedOver | None:
        """An SSE answer: nothing is sent before its first chunk; then it is relayed until it
        ends, breaks or the request's deadline cuts it."""
        chunks = decode_stream(upstream.headers, upstream.chunks()).__aiter__()
        scrub = self._scrubber.stream()  # holds back only a possible key's start
        held = bytearray()  # held back until content (a role-only chunk is no answer yet)
        until = time.perf_counter() + budget
        try:
            while not (_CONTENT.search(held) or len(held) > MAX_HELD_BYTES):
                held += await asyncio.wait_for(chunks.__anext__(),
                                               max(until - time.perf_counter(), 0.001))
        except TimeoutError:
            return self.outcomes.failed(got, "timeout", cr.session)
        except ForwardError:
            return self.outcomes.failed(got, "connect", cr.session)
        except UndecodableError:
            return self.outcomes.failed(got, "upstream_invalid", cr.session)
        except StopAsyncIteration:  # ended without content: relay what it said, if anything
            if not held:
                return self.outcomes.failed(got, "connect", cr.session)
        first_at = time.perf_counter()
        native = native_of(cr, got.candidate)
        if native is not None:
            native.relay()
        meter = TokenMeter(streaming=True, text=cr.ex.req.kind == "completions")
        options = cr.payload.get("stream_options")
        chat = (ChatStream(got.candidate.upstream_model, isinstance(options, dict)
                           and options.get("include_usage") is True)
                if reverse(cr, got.candidate) else None)
        tail = b""
        ex, deadline = cr.ex, cr.deadline
        cr.tally.route = got.route
        ex.started = True
        error: str | None = None
        timer = asyncio.timeout_at(deadline)  # one timer for the whole relay, not per chunk
        try:
            await ex.send({"type": "http.response.start", "status": upstream.status,
                           "headers": self._scrubber.headers(_passed_on(upstream.headers))
                           + cr.tally.headers()})
            chunk = bytes(held)
            try:
                async with timer:
                    while chunk:
                        meter.feed(chunk)
                        tail = (tail + chunk)[-4096:]
                        out = chunk if chat is None else chat.feed(chunk)
                        await ex.send({"type": "http.response.body", "body": scrub.feed(out),
                                       "more_body": True})
                        try:
                            chunk = await chunks.__anext__()
                        except StopAsyncIteration:
                            break
                        except (ForwardError, UndecodableError):
                            error = "connect"
                            break
            except TimeoutError:
                if not timer.expired():
                    raise  # the client's connection, not the deadline (OSError, below)
                error = "timeout"
            last = b"" if chat is None or error is not None else scrub.feed(chat.close())
            end = last + scrub.flush() + (b"" if error is None else broken_event(
                "the provider failed mid-stream; partial response" if error == "connect"
                else "the request's deadline ran out; partial response", native is not None))
            await ex.send({"type": "http.response.body", "body": end, "more_body": False})
        except OSError:
            ex.gone = True
        seconds = max(time.perf_counter() - sent, 1e-6)  # forwarding to the last byte
        tokens = meter.completion_tokens
        kind = OutcomeKind.FAILURE if error else OutcomeKind.SUCCESS
        self.outcomes.record(got, kind, reason=error, used_tokens=total_tokens(tail),
                             completion_tokens=tokens,
                             tokens_per_s=self.outcomes.tps(tokens, seconds),
                             ttfb_ms=(first_at - sent) * 1000, session=cr.session)
        return None

    async def _answer(self, cr: ChainRequest, upstream: UpstreamResponse, got: ChainAttempt,
                      body: bytes) -> None:
        cr.tally.route = got.route
        native = native_of(cr, got.candidate)
        if native is not None:
            native.relay()
        headers = [(k, v) for k, v in self._scrubber.headers(_passed_on(upstream.headers))
                   if k != b"content-length"]
        headers += [(b"content-length", str(len(body)).encode()), *cr.tally.headers()]
        ex = cr.ex
        ex.started = True
        try:
            await ex.send({"type": "http.response.start", "status": upstream.status,
                           "headers": headers})
            await ex.send({"type": "http.response.body", "body": body, "more_body": False})
        except OSError:
            ex.gone = True


def _passed_on(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers a client may see: content type and request ids."""
    return [(k.lower(), v) for k, v in headers if k.lower() in _PASS_ON]


def total_tokens(body: bytes) -> int | None:
    """`usage.total_tokens` of an answer (the last one: usage closes a body or a stream), or
    the last `input_tokens` + `output_tokens` of a Messages answer."""
    tail = body[-65536:]
    found = _TOTAL_TOKENS.findall(tail)
    if found:
        return int(found[-1])
    given, made = _INPUT_TOKENS.findall(tail), _OUTPUT_TOKENS.findall(tail)
    return int(given[-1]) + int(made[-1]) if given and made else None
