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
event, unless its model declares `continue` and another route can go on with it
(chat/providers/continued.py). Every wait is bounded by the first-byte timeout, the chain's
budget and the request's deadline, and the head's by the key's learned first-byte deadline
under its load (chat/deadlines.py `KeyDeadlines`); a head silent between two chunks by the
key's learned gap once warm (`GapDeadlines`, as a mesh route's: a stall past it breaks the
stream), else the forwarder's idle timeout.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Callable, Mapping

from meshroute_middleware.chat.attempts import Failed, Measurement
from meshroute_middleware.chat.deadlines import GapDeadlines, KeyDeadlines, LearnedCut
from meshroute_middleware.chat.dialects.wire.anthropic_chat import (
    ChatStream,
    chat_completion,
    chat_error,
)
from meshroute_middleware.chat.failover import GoingOn
from meshroute_middleware.chat.headers import is_sse
from meshroute_middleware.chat.keyring import Secret
from meshroute_middleware.chat.providers.continued import (
    Going,
    MeshGoOn,
    continuation,
    fail_over,
    transcript_of,
)
from meshroute_middleware.chat.providers.messages_api import (
    broken_event,
    messages_error,
    messages_headers,
    native_of,
    request_payload,
    reverse,
)
from meshroute_middleware.chat.providers.ranking import ProviderRanking
from meshroute_middleware.chat.providers.request import ChainRequest, header
from meshroute_middleware.chat.relay import broken_text, relay
from meshroute_middleware.chat.scrub import Scrubber, UndecodableError, decode_body, decode_stream
from meshroute_middleware.chat.spend import ClientSpend
from meshroute_middleware.core.kinds import ErrorKind
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


# the statistics' error kind of each provider failure reason (else http_5xx)
_KINDS: dict[str, ErrorKind] = {"timeout": "timeout", "connect": "connect",
                                "http_429": "http_429", "context": "context"}


def _failed(code: str, text: str, retry_at: float | None = None) -> Failed:
    """A provider attempt's failure: `code` its reason (exhaustion.ATTEMPT_REASONS)."""
    return Failed(_KINDS.get(code, "http_5xx"), text, retry_at=retry_at, code=code)


class ProviderCall:
    """Makes provider attempts for the chain."""

    def __init__(self, providers: ProviderRouter, secrets: Mapping[str, tuple[Secret, ...]],
                 forwarder: Forwarder, timeouts: ForwardTimeouts,
                 clock: Callable[[], float], spend: ClientSpend | None = None) -> None:
        self.providers, self.secrets, self.forwarder = providers, secrets, forwarder
        self.spend = spend  # a limited client's continuation is reserved (chat/failover.py)
        self.mesh: MeshGoOn | None = None  # the lane's mesh entry: it may continue a stream
        self.timeouts, self.clock = timeouts, clock
        self._scrubber = Scrubber(s.reveal() for keys in secrets.values() for s in keys)
        self.deadlines = KeyDeadlines()  # first-byte deadlines learned per key and load
        self.gaps = GapDeadlines(timeouts.idle_s)  # the gap between chunks, learned per key

    async def __call__(self, cr: ChainRequest, got: ChainAttempt, ranking: ProviderRanking,
                       m: Measurement) -> Failed | None:
        """Try `got`'s key; None once answered (or relayed), else why it failed."""
        c = got.candidate
        payload = request_payload(cr, c)
        body = json.dumps({**{k: v for k, v in payload.items() if k != "route"},
                           "model": c.upstream_model}).encode()
        url, headers = self._where(cr, got, c.model is not None and c.model.api != "openai")
        ranking.begin(got)
        return await self._attempt(cr, got, ranking, m, url, body, headers)

    async def go_on(self, cr: ChainRequest, ranking: ProviderRanking, got: ChainAttempt,
                    m: Measurement, on: GoingOn) -> Failed | None:
        """Continue the stream `on` (chat/failover.py) on `got`'s key (continued.py)."""
        body, going = continuation(on, got.candidate)
        url, headers = self._where(cr, got, going.messages)
        ranking.begin(got)
        return await self._attempt(cr, got, ranking, m, url, body, headers, going)

    def _where(self, cr: ChainRequest, got: ChainAttempt,
               messages: bool) -> tuple[str, list[tuple[bytes, bytes]]]:
        """The URL and headers of an attempt on `got`'s key (a Messages upstream's or not)."""
        c = got.candidate
        assert c.provider is not None and got.key is not None
        secret = self.secrets[c.provider.name][got.key - 1]
        if not messages:
            headers = [(b"content-type", b"application/json"),
                       (b"authorization", b"Bearer " + secret.reveal().encode())]
            url = c.provider.base_url.rstrip("/") + cr.ex.req.path.removeprefix("/v1")
        else:
            headers = messages_headers(cr, secret.reveal())
            url = c.provider.base_url.rstrip("/") + "/messages"
        if (accept := header(cr.ex.scope, b"accept")) is not None:
            headers.append((b"accept", accept.encode("latin-1")))
        return url, headers

    def _budget(self, cr: ChainRequest) -> float:
        return min(self.timeouts.first_byte_s, cr.time_to_deadline(),
                   self.providers.time_left(cr.started, self.clock()))

    async def _attempt(self, cr: ChainRequest, got: ChainAttempt, ranking: ProviderRanking,
                       m: Measurement, url: str, body: bytes,
                       headers: list[tuple[bytes, bytes]],
                       going: Going | None = None) -> Failed | None:
        budget = self._budget(cr)
        sent = time.perf_counter()
        req = cr.ex.req
        reached, req.reached = req.reached, got.route  # sent: charged its prompt from here
        try:
            upstream = await self.deadlines.open(got.route, self.forwarder.open(url, body,
                                                                                headers), budget)
        except LearnedCut as exc:  # a timeout like any: the chain falls over to the next
            return _failed("timeout", str(exc))
        except TimeoutError:
            return _failed("timeout", "no first byte within the attempt's budget")
        except ForwardError as exc:
            if exc.kind == "connect":  # never reached the provider
                req.reached = reached
            if exc.kind == "http_429":
                now = self.clock()
                wait = parse_retry_after(exc.retry_after, now)
                return _failed("http_429", str(exc), None if wait is None else now + wait)
            return _failed(failure_reason(exc.kind), str(exc))
        try:
            if upstream.status in REVOKING_STATUSES:
                return _failed(f"http_{upstream.status}", f"the provider refused key {got.key}")
            if going is not None and (upstream.status >= 400 or not is_sse(upstream.headers)):
                return _failed("capability", f"the route did not continue the answer "
                                             f"({upstream.status})")
            if upstream.status >= 400:
                return await self._client_error(cr, got, ranking, upstream, budget)
            if is_sse(upstream.headers):
                return await self._stream(cr, got, ranking, m, upstream, sent, budget, going)
            return await self._whole(cr, got, ranking, upstream, sent, budget)
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

    async def _client_error(self, cr: ChainRequest, got: ChainAttempt,
                            ranking: ProviderRanking, upstream: UpstreamResponse,
                            budget: float) -> Failed | None:
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
            return _failed("context", f"the provider refused the request's size "
                                      f"({upstream.status})")
        if reverse(cr, got.candidate):
            body = chat_error(upstream.status, body)
        ranking.outcome(got, OutcomeKind.CLIENT_ERROR)
        await self._answer(cr, upstream, got, self._scrubber.scrub(body))
        return None

    async def _whole(self, cr: ChainRequest, got: ChainAttempt, ranking: ProviderRanking,
                     upstream: UpstreamResponse, sent: float, budget: float) -> Failed | None:
        """A JSON answer: held whole (its usage settles the reservation), then sent."""
        try:
            body = await self._read_all(upstream, budget)
        except TimeoutError:
            return _failed("timeout", "the answer did not come whole within the budget")
        except ForwardError as exc:
            return _failed("connect", str(exc))
        except UndecodableError as exc:  # a body it cannot have meant: a bad answer, not a cut
            return _failed("upstream_invalid", str(exc))
        done = time.perf_counter()
        meter = TokenMeter(streaming=False)
        meter.feed(body)
        answer = body
        if reverse(cr, got.candidate):
            try:
                answer = json.dumps(chat_completion(json.loads(body),
                                                    got.candidate.upstream_model)).encode()
            except (ValueError, UnicodeDecodeError, AttributeError):
                return _failed("upstream_invalid", "the Messages answer could not be read")
        seconds = max(done - sent, 1e-6)
        # an embeddings answer is measured in inputs/s, recorded in the embeddings lane's
        # own statistics (docs/architecture.md, "Statistics per request kind")
        inputs = cr.ex.req.inputs
        prompt, completion, cached, _ = meter.counts()  # cached: what a cache hit saves
        done_units = completion if inputs is None else inputs
        ranking.outcome(got, OutcomeKind.SUCCESS, used_tokens=total_tokens(body),
                        completion_tokens=done_units,
                        tokens_per_s=ranking.tps(done_units, seconds),
                        ttfb_ms=seconds * 1000, prompt_tokens=prompt, cached_tokens=cached)
        await self._answer(cr, upstream, got, self._scrubber.scrub(answer))
        return None

    async def _stream(self, cr: ChainRequest, got: ChainAttempt, ranking: ProviderRanking,
                      m: Measurement, upstream: UpstreamResponse, sent: float,
                      budget: float, going: Going | None = None) -> Failed | None:
        """An SSE answer: nothing is sent before its first chunk; then it is relayed
        (chat.relay) until it ends, breaks or the request's deadline cuts it. A stream that
        may be continued (chat/providers/continued.py) goes on on the next route that can
        continue it when it breaks; `going`: this one continues another's."""
        paced = self.gaps.paced(got.route, upstream)
        chunks = decode_stream(upstream.headers, paced).__aiter__()
        scrub = self._scrubber.stream()  # holds back only a possible key's start
        held = bytearray()  # held back until content (a role-only chunk is no answer yet)
        until = time.perf_counter() + budget
        try:
            while not (_CONTENT.search(held) or len(held) > MAX_HELD_BYTES):
                held += await asyncio.wait_for(chunks.__anext__(),
                                               max(until - time.perf_counter(), 0.001))
        except TimeoutError:
            return _failed("timeout", "no content within the attempt's budget")
        except ForwardError as exc:
            paced.end(exc.kind)
            return _failed("connect", str(exc))
        except UndecodableError as exc:
            return _failed("upstream_invalid", str(exc))
        except StopAsyncIteration:  # ended without content: relay what it said, if anything
            if not held:
                return _failed("connect", "the stream ended before any content")
        native = None if going is not None else native_of(cr, got.candidate)
        if native is not None:
            native.relay()
        m.answer(upstream.headers)
        options = cr.payload.get("stream_options")
        chat = (ChatStream(got.candidate.upstream_model, isinstance(options, dict)
                           and options.get("include_usage") is True)
                if (reverse(cr, got.candidate) if going is None else going.messages) else None)
        transcript = transcript_of(cr, got, native, going)
        tail = bytearray()  # the stream's last bytes: its usage

        def passed_on(chunk: bytes) -> bytes:
            tail[:] = (tail + chunk)[-4096:]
            out = chunk if chat is None else chat.feed(chunk)
            return scrub.feed(out if transcript is None else transcript(out))

        ex = cr.ex
        if going is None:
            cr.tally.route = got.route
        ex.started = True
        error = ""
        recorded = False

        def record() -> None:
            nonlocal recorded
            if recorded:
                return
            recorded = True
            seconds = max(time.perf_counter() - sent, 1e-6)  # forwarding to the last byte
            meter = m.meter
            tokens = meter.completion_tokens if meter is not None else 0
            first_at = m.first if m.first is not None else time.perf_counter()
            ranking.outcome(got, OutcomeKind.FAILURE if error else OutcomeKind.SUCCESS,
                            reason=error or None, used_tokens=total_tokens(bytes(tail)),
                            completion_tokens=tokens, tokens_per_s=ranking.tps(tokens, seconds),
                            ttfb_ms=(first_at - sent) * 1000,
                            prompt_tokens=meter.prompt_tokens if meter is not None else None,
                            cached_tokens=meter.cached_tokens if meter is not None else 0)

        try:
            if going is None:
                await ex.send({"type": "http.response.start", "status": upstream.status,
                               "headers": self._scrubber.headers(_passed_on(upstream.headers))
                               + cr.tally.headers()})
            broke = await relay(ex.send, _readable(bytes(held), chunks), cr.deadline, m,
                                passed_on)
            paced.end(broke)
            error = "" if not broke else "timeout" if broke == "timeout" else "connect"
            if broke and transcript is not None:
                upstream.close()
                record()
                if await fail_over(cr, got, ranking, m, transcript, broke, scrub.flush(),
                                   self.go_on, self.mesh, self.spend):
                    return None
            last = b"" if chat is None or error else chat.close()
            if transcript is not None and not error:
                last = transcript(last) + transcript.flush()
            end = scrub.feed(last) + scrub.flush() + (b"" if not error else broken_event(
                broken_text(error), native is not None))
        except OSError:
            ex.gone = True
            record()
            return None
        try:  # the whole answer was relayed: it is recorded even if the client leaves now
            await ex.send({"type": "http.response.body", "body": end, "more_body": False})
        except OSError:
            ex.gone = True
        except BaseException:
            record()
            raise
        record()
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


async def _readable(first: bytes, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The held start, then the rest of a decoded stream; a stream that cannot be decoded
    breaks off like a cut one."""
    yield first
    try:
        async for chunk in chunks:
            yield chunk
    except UndecodableError as exc:
        raise ForwardError("stream", str(exc)) from exc


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
