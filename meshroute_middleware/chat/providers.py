"""Provider routes in the chat path (issue 12): one request, one chain of provider keys and
mesh models, tried in the ProviderRouter's order until one answers.

- `model` of `auto`, `auto:*` or `<provider>/<model id>` comes here (`ProviderChat.claims`);
  any other model stays on the mesh path, exactly as without provider routes.
- A provider attempt POSTs `{base_url}/chat/completions` through the gateway's forwarder with
  the upstream's own model id in the body and `Authorization: Bearer <key>`; no header of the
  client's goes upstream but `accept` (its Authorization least of all).
- A mesh entry of the chain runs the mesh Router's own attempts (its bandit across shard
  routes, `ForwardMode`'s attempt), and its outcome is reported to the ProviderRouter, so the
  chain ranks mesh and provider routes on the same axes.
- Nothing reaches the client before the first content byte of an answer: until then a failure
  (429, 5xx, timeout, connect, a stream that breaks before its first chunk) falls over to the
  next route, invisibly. After it, a broken stream ends with an SSE error event.
- Every response carries `x-meshroute-route` (`fastco/big-model#2`: the key's position, never
  the key), `x-meshroute-attempts` and `x-meshroute-tried`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from meshroute_middleware.chat.attempts import Attempts, Exchange
from meshroute_middleware.chat.forward import ForwardMode
from meshroute_middleware.chat.headers import H_ROUTE, OURS, is_sse
from meshroute_middleware.chat.keyring import Secret
from meshroute_middleware.chat.scrub import Scrubber, UndecodableError, decode_body, decode_stream
from meshroute_middleware.chat.watchdog import Watchdog
from meshroute_middleware.core import InvalidPinError, NoRouteError, Router, UnknownModelError
from meshroute_middleware.core.providers.chain import Candidate, InvalidModelError, Resolution
from meshroute_middleware.core.providers.exhaustion import PassedOver
from meshroute_middleware.core.providers.keys import (
    REVOKING_STATUSES,
    Reservation,
    parse_retry_after,
)
from meshroute_middleware.core.providers.router import Attempt, ProviderRouter
from meshroute_middleware.core.providers.scoring import OutcomeKind
from meshroute_middleware.core.providers.tokens import estimate
from meshroute_middleware.forwarding.client import Forwarder, ForwardError, UpstreamResponse
from meshroute_middleware.forwarding.measure import TokenMeter, sse_error_event
from meshroute_middleware.http.errors import error_body, send_error
from meshroute_middleware.http.request import ChatRequest, answer_bound
from meshroute_middleware.telemetry.metrics import (
    Telemetry,
    provider_key_families,
    provider_outcome,
)

log = logging.getLogger("meshroute.providers")
WAIT_MARGIN_S = 0.05  # slept past the soonest key reset before trying again

H_ATTEMPTS, H_TRIED = b"x-meshroute-attempts", b"x-meshroute-tried"
H_SESSION = b"x-session-id"
MAX_BODY_BYTES = 32 * 1024 * 1024  # a non-streamed answer held to read its usage
MAX_HELD_BYTES = 64 * 1024  # a stream's start held back while it carries no content
_CONTENT = re.compile(rb'"content"\s*:\s*"(?!")|data: \[DONE\]')
_TOTAL_TOKENS = re.compile(rb'"total_tokens"\s*:\s*(\d+)')
_CONTEXT_REFUSAL = re.compile(rb"context[_ ]length|maximum context|too many tokens", re.I)
_PASS_ON = frozenset({b"content-type", b"openai-processing-ms", b"x-request-id"})
_NEXT_KEY = frozenset({"http_429", "http_401", "http_403"})  # the key failed: try the next key
# Shared key gates take a key in their store (awaited): (candidate, reserve, now, context need)
Acquire = Callable[[Candidate, int, float, int], Awaitable[Attempt | list[PassedOver]]]
_REASONS = {"http_429": "http_429", "http_5xx": "http_5xx", "timeout": "timeout",
            "connect": "connect"}


@dataclass(slots=True)
class _Tally:
    """What the client is told about the attempts: `x-meshroute-*` of every response."""

    tried: list[str]
    route: str | None = None
    chain: str = ""  # the model the client asked for (telemetry's `chain`)

    def headers(self) -> list[tuple[bytes, bytes]]:
        route = self.route or (self.tried[-1] if self.tried else "none")
        return [(H_ROUTE, route.encode()), (H_ATTEMPTS, str(len(self.tried)).encode()),
                (H_TRIED, ",".join(self.tried).encode())]


class _MeshSend:
    """The client's send while a mesh entry runs: our headers added, the answer measured."""

    __slots__ = ("_send", "_tally", "end", "first", "meter", "started", "status")

    def __init__(self, send: Send, tally: _Tally) -> None:
        self._send, self._tally = send, tally
        self.status: int | None = None
        self.first: float | None = None
        self.end: float | None = None
        self.meter: TokenMeter | None = None
        self.started = False

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            headers = list(message.get("headers", ()))
            self.meter = TokenMeter(streaming=is_sse(headers))
            route = next((v for k, v in headers if k == H_ROUTE), None)
            if route is not None:  # the mesh route's signature, as the mesh path says it
                self._tally.route = route.decode("latin-1")
            headers = [(k, v) for k, v in headers if not k.lower().startswith(OURS)]
            message = {**message, "headers": headers + self._tally.headers()}
            self.started = True
        elif message["type"] == "http.response.body":
            body = message.get("body", b"")
            now = time.perf_counter()
            if body and self.first is None:
                self.first = now
            if not message.get("more_body", False):
                self.end = now
            if self.meter is not None:
                self.meter.feed(body)
        await self._send(message)


def with_tried(send: Send, attempts: Attempts) -> Send:
    """The mesh path's send, with `x-meshroute-attempts` and `x-meshroute-tried` added (mesh
    route signatures, in order) where the gateway has provider routes too."""
    async def _send(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            tried = list(attempts.failures or ())
            route = next((v.decode("latin-1") for k, v in headers if k == H_ROUTE), None)
            if route is not None and route not in tried:
                tried.append(route)
            headers += [(H_ATTEMPTS, str(len(tried)).encode()),
                        (H_TRIED, ",".join(tried).encode())]
            message = {**message, "headers": headers}
        await send(message)
    return _send


class ProviderChat:
    """Serves chat requests whose model names a provider route, `auto` or `auto:*`."""

    def __init__(self, providers: ProviderRouter, secrets: Mapping[str, tuple[Secret, ...]],
                 forwarder: Forwarder, router: Router, telemetry: Telemetry, *,
                 first_byte_timeout_s: float = 60.0, clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, acquire: Acquire | None = None) -> None:
        self.providers, self.secrets = providers, secrets
        self.forwarder, self.router, self.telemetry = forwarder, router, telemetry
        self.first_byte_timeout_s = first_byte_timeout_s
        self.clock = clock
        self.rng = rng or random.Random()
        self.acquire = acquire  # shared key gates (issue 23); None: the router's own
        self.mesh = ForwardMode(forwarder)
        self._watchdog = Watchdog()
        self._all_secrets = tuple(s for keys in secrets.values() for s in keys)
        self._scrubber = Scrubber(s.reveal() for s in self._all_secrets)  # every form of a key
        self._settled: set[Reservation] = set()  # recorded attempts still under way
        # provider attempts under way: (chain, attempt number, perf_counter at the start)
        self._live: dict[Attempt, tuple[str, int, float]] = {}
        telemetry.add_collector(lambda: provider_key_families(providers, self.clock()))

    with_tried = staticmethod(with_tried)

    def claims(self, model: str) -> bool:
        """Whether a request for `model` takes the provider chain (else the mesh path)."""
        return (model == "auto" or model.startswith("auto:")
                or self.providers.cfg.names_provider(model))

    async def serve(self, scope: Scope, receive: Receive, send: Send, req: ChatRequest) -> None:
        """Answer one chat request: a route's answer, or why none could give one."""
        tally = _Tally([], chain=req.model)
        try:
            res = self.providers.resolve(req.model, self.router.models())
        except InvalidModelError as exc:
            await send_error(send, 400, str(exc), "invalid_model", tally.headers())
            return
        except UnknownModelError as exc:
            await send_error(send, 404, str(exc), "model_not_found", tally.headers())
            return
        ex = Exchange(scope, receive, _MeshSend(send, tally), req,
                      Attempts(self.router, self.telemetry, req.model))
        opened: list[Attempts] = [ex.attempts]
        self.telemetry.in_flight += 1
        task = self._watchdog.watch(ex)
        try:
            await self._serve(ex, res, tally, send, opened)
        except asyncio.CancelledError:
            if not ex.gone:
                raise
            task.uncancel()  # the client left; nothing more to send
        except InvalidPinError as exc:
            await send_error(send, 400, str(exc), "invalid_route", tally.headers())
        except Exception:  # a bug of ours: a JSON error, never a traceback
            log.exception("meshroute: internal error while routing over providers")
            if ex.started:
                raise
            await send_error(send, 500, "internal error in meshroute; see the server log",
                             "internal_error", tally.headers())
        finally:
            self._watchdog.forget(ex)
            self.telemetry.in_flight -= 1
            for attempts in opened:
                attempts.close()

    async def _serve(self, ex: Exchange, res: Resolution, tally: _Tally, send: Send,
                     opened: list[Attempts]) -> None:
        try:
            payload = json.loads(ex.req.body)
        except ValueError:  # parse_chat accepted it with orjson; the stdlib must agree
            await send_error(send, 400, "request body is not valid JSON", "invalid_json",
                             tally.headers())
            return
        est = estimate(payload)
        session = _header(ex.scope, H_SESSION)
        pin = ex.req.pin[0] if ex.req.pin and len(ex.req.pin) == 1 else None
        if ex.req.pin is not None and pin is None:
            raise InvalidPinError("pin one route of the chain: 'route': [\"provider/model\"]")
        started = self.clock()
        passed: list[PassedOver] = []
        for _ in range(2):  # once, and once more after waiting for a key (wait_for_key_s)
            run: list[PassedOver] = []
            ranked = self.providers.rank(res, self.clock(), self.rng, pinned=pin,
                                         session=session, tokens=est.context_need)
            for scored in ranked:
                if await self._candidate(ex, scored.candidate, payload, est.reserve,
                                         est.context_need, session, started, tally, run,
                                         opened):
                    return
                if ex.started:
                    return
            passed = run + [p for p in passed if p.route not in {r.route for r in run}]
            wait = self.providers.wait_for_key(passed, started, self.clock())
            if wait is None:
                break
            log.info("providers: every key of %r is limited; waiting %.1f s for one",
                     res.model, wait)
            # a hair past the reset: a wake-up exactly on it can still find the key limited
            await asyncio.sleep(wait + WAIT_MARGIN_S)
        exhausted = self.providers.exhausted(res, passed, self.clock())
        status = exhausted.status
        if exhausted.mesh_only and status == 503 and passed and all(
                p.reason == "http_429" for p in passed):
            status = 429  # a mesh-only chain keeps today's answer: 429 when all were limited
        body = json.dumps(exhausted.error_body()).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()), *tally.headers(),
                   *((k.lower().encode(), v.encode()) for k, v in exhausted.headers().items())]
        ex.started = True
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _candidate(self, ex: Exchange, c: Candidate, payload: dict[str, Any],
                         reserve: int, need: int, session: str | None, started: float,
                         tally: _Tally, passed: list[PassedOver],
                         opened: list[Attempts]) -> bool:
        """Try one candidate (each of its keys in turn after a 429); True once answered."""
        while self.providers.may_attempt(len(tally.tried), started, self.clock()):
            got = (self.providers.acquire(c, reserve, self.clock(), context_tokens=need)
                   if self.acquire is None else await self.acquire(c, reserve, self.clock(), need))
            if isinstance(got, list):
                passed += got
                return False
            tally.tried.append(got.route)
            if c.is_provider:
                over = await self._provider(ex, got, payload, session, started, tally)
            else:
                over = await self._mesh(ex, got, payload, session, tally, opened)
            if over is None:
                return True
            if ex.started:  # a client error relayed as it was: the request is over
                return True
            passed.append(over)
            log.info("providers: %s passed over (%s)", over.route, over.reason)
            if over.reason not in _NEXT_KEY or not c.is_provider:
                return False
        return False

    # -- a provider key ---------------------------------------------------------------------

    async def _provider(self, ex: Exchange, got: Attempt, payload: dict[str, Any],
                        session: str | None, started: float,
                        tally: _Tally) -> PassedOver | None:
        c = got.candidate
        assert c.provider is not None and got.key is not None
        secret = self.secrets[c.provider.name][got.key - 1]
        body = json.dumps({**{k: v for k, v in payload.items() if k != "route"},
                           "model": c.upstream_model}).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"authorization", b"Bearer " + secret.reveal().encode())]
        if (accept := _header(ex.scope, b"accept")) is not None:
            headers.append((b"accept", accept.encode("latin-1")))
        url = c.provider.base_url.rstrip("/") + "/chat/completions"
        self._live[got] = (tally.chain, len(tally.tried) - 1, time.perf_counter())
        self.telemetry.provider_decided(tally.chain, c.route, got.route, len(tally.tried) - 1)
        try:
            return await self._provider_attempt(ex, got, url, body, headers, session,
                                                started, tally)
        except asyncio.CancelledError:  # the client left: settle the reservation, blame nobody
            if not got.reservation or got.reservation not in self._settled:
                self.providers.record(got, OutcomeKind.CLIENT_ERROR, self.clock())
            raise
        finally:
            self._live.pop(got, None)
            if got.reservation is not None:
                self._settled.discard(got.reservation)

    async def _provider_attempt(self, ex: Exchange, got: Attempt, url: str, body: bytes,
                                headers: list[tuple[bytes, bytes]], session: str | None,
                                started: float, tally: _Tally) -> PassedOver | None:
        budget = min(self.first_byte_timeout_s, self.providers.time_left(started, self.clock()))
        sent = time.perf_counter()
        try:
            upstream = await asyncio.wait_for(self.forwarder.open(url, body, headers), budget)
        except TimeoutError:
            return self._failed(got, "timeout", session)
        except ForwardError as exc:
            if exc.kind == "http_429":
                return self._record(
                    got, OutcomeKind.RATE_LIMITED, self.clock(), session=session,
                    retry_after_s=parse_retry_after(exc.retry_after, self.clock()))
            return self._failed(got, _REASONS.get(exc.kind, "http_5xx"), session)
        try:
            if upstream.status in REVOKING_STATUSES:
                return self._key_refused(got, upstream.status)
            if upstream.status >= 400:
                return await self._client_error(ex, got, upstream, session, tally, budget)
            if is_sse(upstream.headers):
                return await self._stream(ex, got, upstream, session, tally, sent, budget)
            return await self._whole(ex, got, upstream, session, tally, sent, budget)
        finally:
            upstream.close()

    def _record(self, got: Attempt, kind: OutcomeKind, now: float, *,
                completion_tokens: int = 0, **kw: Any) -> PassedOver | None:
        """The ProviderRouter's record, remembered so that a cancellation does not settle the
        reservation twice; a provider attempt's outcome is published too."""
        if got.reservation is not None:
            self._settled.add(got.reservation)
        over = self.providers.record(got, kind, now, **kw)
        live = self._live.get(got)
        if live is not None:  # a mesh entry's own attempts published themselves
            self.telemetry.provider_finished(
                live[0], got.candidate.route, got.route, live[1],
                *provider_outcome(kind, over, completion_tokens,
                                  time.perf_counter() - live[2], kw.get("ttfb_ms"),
                                  sampled=kw.get("tokens_per_s") is not None))
        return over

    def _key_refused(self, got: Attempt, status: int) -> PassedOver:
        """The provider refused the key (401/403): out of rotation, the next key is tried."""
        if got.reservation is not None:
            self._settled.add(got.reservation)
        log.warning("providers: %s answered %d: key %s taken out of rotation until cleared "
                    "or restarted", got.route, status, got.key)
        return self.providers.key_refused(got, status, self.clock())

    def _tps(self, tokens: int, seconds: float) -> float | None:
        """A tok/s sample, when the answer had enough tokens to be one (as on the mesh)."""
        return tokens / seconds if tokens >= self.router.config.min_sample_tokens else None

    def _failed(self, got: Attempt, reason: str, session: str | None) -> PassedOver | None:
        return self._record(got, OutcomeKind.FAILURE, self.clock(), reason=reason,
                            session=session)

    async def _read_all(self, upstream: UpstreamResponse, budget: float) -> bytes:
        async def read() -> bytes:
            out = bytearray()
            async for chunk in upstream.chunks():
                out += chunk
                if len(out) > MAX_BODY_BYTES:
                    raise ForwardError("stream", "the answer is larger than meshroute holds")
            return decode_body(upstream.headers, bytes(out))  # compressed: read before scrubbing
        return await asyncio.wait_for(read(), budget)

    async def _client_error(self, ex: Exchange, got: Attempt, upstream: UpstreamResponse,
                            session: str | None, tally: _Tally,
                            budget: float) -> PassedOver | None:
        """A 4xx: the client's own mistake, relayed; a context-length refusal falls over."""
        try:
            body = await self._read_all(upstream, budget)
        except (ForwardError, TimeoutError):
            body = b""
        except UndecodableError as exc:  # never relayed as it came: our own error instead
            body = error_body(upstream.status, f"the provider's error answer could not be "
                              f"read: {exc}", "upstream_undecodable")
        if upstream.status in (400, 413) and _CONTEXT_REFUSAL.search(body):
            return self._record(got, OutcomeKind.CLIENT_ERROR, self.clock(),
                                reason="context", session=session)
        self._record(got, OutcomeKind.CLIENT_ERROR, self.clock(), session=session)
        await self._answer(ex, upstream, tally, got.route, self._scrub(body))
        return None

    async def _whole(self, ex: Exchange, got: Attempt, upstream: UpstreamResponse,
                     session: str | None, tally: _Tally, sent: float,
                     budget: float) -> PassedOver | None:
        """A JSON answer: held whole (its usage settles the reservation), then sent."""
        try:
            body = await self._read_all(upstream, budget)
        except TimeoutError:
            return self._failed(got, "timeout", session)
        except (ForwardError, UndecodableError):
            return self._failed(got, "connect", session)
        done = time.perf_counter()
        used = _total_tokens(body)
        meter = TokenMeter(streaming=False)
        meter.feed(body)
        seconds = max(done - sent, 1e-6)
        self._record(got, OutcomeKind.SUCCESS, self.clock(), used_tokens=used,
                     completion_tokens=meter.completion_tokens,
                     tokens_per_s=self._tps(meter.completion_tokens, seconds),
                     ttfb_ms=seconds * 1000, session=session)
        await self._answer(ex, upstream, tally, got.route, self._scrub(body))
        return None

    async def _stream(self, ex: Exchange, got: Attempt, upstream: UpstreamResponse,
                      session: str | None, tally: _Tally, sent: float,
                      budget: float) -> PassedOver | None:
        """An SSE answer: nothing is sent before its first chunk; then it is relayed."""
        chunks = decode_stream(upstream.headers, upstream.chunks()).__aiter__()
        scrub = self._scrubber.stream()  # holds back only a possible key's start
        held = bytearray()  # held back until content (a role-only chunk is no answer yet)
        deadline = time.perf_counter() + budget
        try:
            while not (_CONTENT.search(held) or len(held) > MAX_HELD_BYTES):
                held += await asyncio.wait_for(chunks.__anext__(),
                                               max(deadline - time.perf_counter(), 0.001))
        except TimeoutError:
            return self._failed(got, "timeout", session)
        except (ForwardError, UndecodableError):
            return self._failed(got, "connect", session)
        except StopAsyncIteration:  # ended without content: relay what it said, if anything
            if not held:
                return self._failed(got, "connect", session)
        first = bytes(held)
        first_at = time.perf_counter()
        meter = TokenMeter(streaming=True)
        tail = b""
        tally.route = got.route
        ex.started = True
        error = False
        try:
            await ex.send({"type": "http.response.start", "status": upstream.status,
                           "headers": self._scrubber.headers(_passed_on(upstream.headers))
                           + tally.headers()})
            chunk = first
            while chunk:
                meter.feed(chunk)
                tail = (tail + chunk)[-4096:]
                await ex.send({"type": "http.response.body", "body": scrub.feed(chunk),
                               "more_body": True})
                try:
                    chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except (ForwardError, UndecodableError):
                    error = True
                    break
            end = scrub.flush() + (sse_error_event(
                "the provider failed mid-stream; partial response") if error else b"")
            await ex.send({"type": "http.response.body", "body": end, "more_body": False})
        except OSError:
            ex.gone = True
        seconds = max(time.perf_counter() - sent, 1e-6)  # forwarding to the last byte
        tokens = meter.completion_tokens
        kind = OutcomeKind.FAILURE if error else OutcomeKind.SUCCESS
        self._record(got, kind, self.clock(), reason="connect" if error else None,
                     used_tokens=_total_tokens(tail), completion_tokens=tokens,
                     tokens_per_s=self._tps(tokens, seconds),
                     ttfb_ms=(first_at - sent) * 1000, session=session)
        return None

    async def _answer(self, ex: Exchange, upstream: UpstreamResponse, tally: _Tally,
                      route: str, body: bytes) -> None:
        tally.route = route
        headers = [(k, v) for k, v in self._scrubber.headers(_passed_on(upstream.headers))
                   if k != b"content-length"]
        headers += [(b"content-length", str(len(body)).encode()), *tally.headers()]
        ex.started = True
        try:
            await ex.send({"type": "http.response.start", "status": upstream.status,
                           "headers": headers})
            await ex.send({"type": "http.response.body", "body": body, "more_body": False})
        except OSError:
            ex.gone = True

    def _scrub(self, body: bytes) -> bytes:
        """An upstream may echo the key it was given (some do, in a 401): never pass it on."""
        return self._scrubber.scrub(body)

    # -- a mesh model -----------------------------------------------------------------------

    async def _mesh(self, ex: Exchange, got: Attempt, payload: dict[str, Any],
                    session: str | None, tally: _Tally,
                    opened: list[Attempts]) -> PassedOver | None:
        """The mesh Router's own attempts over the model's shard routes, reported here."""
        model = got.candidate.route
        bound = answer_bound(payload)
        try:
            decision = self.router.choose(model, None, bound)
        except (UnknownModelError, NoRouteError):
            return self._failed(got, "connect", session)
        attempts = Attempts(self.router, self.telemetry, model)
        opened.append(attempts)
        ex.attempts = attempts
        ex.req = ChatRequest(json.dumps({**{k: v for k, v in payload.items() if k != "route"},
                                         "model": model}).encode(), model, None, bound)
        send = ex.send
        assert isinstance(send, _MeshSend)
        sent = time.perf_counter()
        _, failed = await attempts.run(decision, self.mesh._attempt, ex)
        if failed is not None:
            return self._failed(got, _REASONS.get(failed.kind, "http_5xx"), session)
        if send.status is not None and 400 <= send.status < 500:
            self._record(got, OutcomeKind.CLIENT_ERROR, self.clock(), session=session)
            return None
        first = send.first if send.first is not None else time.perf_counter()
        end = send.end if send.end is not None else time.perf_counter()
        tokens = send.meter.completion_tokens if send.meter is not None else 0
        seconds = max(end - sent, 1e-6)  # forwarding to the last byte (DESIGN.md)
        self._record(got, OutcomeKind.SUCCESS, self.clock(),
                     tokens_per_s=self._tps(tokens, seconds),
                     ttfb_ms=(first - sent) * 1000, session=session)
        return None


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope.get("headers", ()):
        if k == name:
            return str(v.decode("latin-1"))
    return None


def _passed_on(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The upstream's response headers a client may see: content type and request ids."""
    return [(k.lower(), v) for k, v in headers if k.lower() in _PASS_ON]


def _total_tokens(body: bytes) -> int | None:
    """`usage.total_tokens` of an answer (the last one: usage closes a body or a stream)."""
    found = _TOTAL_TOKENS.findall(body[-65536:])
    return int(found[-1]) if found else None
