"""One attempt lifecycle for every path (forward, annotate, the provider chain and its mesh
entries, the mitmproxy addon): choose → attempt → measure → record or cancel → fall back →
answer or exhaust.

What differs between paths is the `Ranking` (the mesh Router's, which `Attempts` runs itself; the
ProviderRouter's, chat/providers/ranking.py) and the attempt itself (forward, annotate, a
provider call, a mitmproxy flow); the loop, the deadline and the exhaustion answer are these.

The rules live here once:
- a request has one deadline (`request_timeout_s` from the moment it is served): no attempt
  outlives it, and past it no further route is tried (`Attempts.deadline`);
- a failure before the first byte is recorded, and the next ranked route is tried;
- the client's own mistake (a 4xx) or a client that left before any byte says nothing of the
  route: the attempt is cancelled, not recorded;
- anything else is recorded as measured (a client that left mid-way leaves a sample of what
  was delivered until then);
- when every route failed the client gets the one exhaustion answer of every path
  (core/providers/exhaustion.py's rule, http/errors.py's codes: 429 `rate_limited` when a
  route was limited, 502 `upstream_failed` when routes failed upstream, 503
  `no_route_available` when none could be tried), or 504 `request_timeout` when the deadline
  ran out first, listing route by route why each was passed over:
  `"routes": [{"route", "reason", "until"}]`.
"""

from __future__ import annotations

import asyncio
import logging
import sys
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar

from starlette.types import Message, Receive, Scope, Send

from meshroute_middleware.chat.headers import Headers, is_sse, response_headers
from meshroute_middleware.core import Decision, Outcome, Router
from meshroute_middleware.core.contracts.error_body import sse_error_event
from meshroute_middleware.core.contracts.limits import MAX_ANSWER_TOKENS, MAX_TPS
from meshroute_middleware.core.kinds import CONTEXT, ErrorKind
from meshroute_middleware.core.providers.exhaustion import (
    Exhaustion,
    PassedOver,
    by_rule,
    firsts,
)
from meshroute_middleware.core.providers.keys import parse_retry_after
from meshroute_middleware.forwarding.client import ForwarderClosed
from meshroute_middleware.forwarding.measure import TokenMeter
from meshroute_middleware.http.errors import (
    INTERNAL_ERROR,
    SHUTTING_DOWN_MESSAGE,
    DeadlineExceeded,
    ErrorAnswer,
    HttpError,
    exhaustion_answer,
)
from meshroute_middleware.http.request import ChatRequest, RequestKind
from meshroute_middleware.telemetry.metrics import Telemetry

if TYPE_CHECKING:
    from meshroute_middleware.chat.hedge import Hedge

DEFAULT_REQUEST_TIMEOUT_S = 600.0  # the one home of this default (settings refer to it)
log = logging.getLogger("meshroute.attempts")
T = TypeVar("T")
D = TypeVar("D")


class Exchange:
    """One chat request being served: the request, its client's send, its attempts, and what
    its error path and the disconnect watchdog need to know."""

    __slots__ = ("attempts", "expired", "gone", "receive", "req", "scope", "seen", "send",
                 "started", "task", "watcher")

    def __init__(self, scope: Scope, receive: Receive, send: Send, req: ChatRequest,
                 attempts: Attempts) -> None:
        self.scope, self.receive, self.send, self.req = scope, receive, send, req
        self.attempts = attempts
        self.started = False  # the client got a response start: too late for an error reply
        self.gone = False  # the client disconnected
        self.expired = False  # the watchdog cancelled it at its deadline (annotate mode)
        self.task: asyncio.Task[Any] | None = None  # the task serving it (while watched)
        self.seen = False  # a watchdog sweep has seen it under way
        self.watcher: asyncio.Task[None] | None = None


# Completion tokens a request without `max_tokens` may be credited with (2**20, the most any
# request's bound is read as): a node's claim beyond it is clipped, so no lie about usage
# reaches the statistics.
DEFAULT_TOKEN_CEILING = MAX_ANSWER_TOKENS


class Measurement:
    """Times one attempt and counts the tokens of its answer as they pass; what it reports is
    clamped (docs/security.md): tokens to the request's `max_tokens` (else
    DEFAULT_TOKEN_CEILING), and tokens/s to limits.MAX_TPS. An embeddings attempt counts its
    request's `inputs` instead, once answered whole: its samples are inputs per second."""

    __slots__ = ("ceiling", "first", "inputs", "last", "meter", "start", "text")

    def __init__(self, max_tokens: int | None = None, *, inputs: int | None = None,
                 text: bool = False) -> None:
        self.ceiling = max_tokens if max_tokens is not None else DEFAULT_TOKEN_CEILING
        self.inputs = inputs
        self.text = text  # a completions answer: its stream's tokens are `text` deltas
        self.start = time.perf_counter()
        self.first: float | None = None  # the answer's first body byte
        self.last: float | None = None  # the answer's end
        self.meter: TokenMeter | None = None

    def answer(self, headers: Iterable[tuple[bytes, bytes]]) -> TokenMeter:
        """The answer's headers are in: count its body from now on."""
        self.meter = TokenMeter(streaming=is_sse(headers), text=self.text)
        return self.meter

    def failure(self, kind: ErrorKind) -> Outcome:
        """A failure before the first byte."""
        return Outcome(0, time.perf_counter() - self.start, 0.0, kind)

    def outcome(self, error: ErrorKind | Literal[""] = "") -> Outcome:
        """What was measured, as the router records it."""
        last = self.last if self.last is not None else time.perf_counter()
        first = self.first if self.first is not None else last
        if self.inputs is not None:
            tokens = 0 if error or self.meter is None else self.inputs
        else:
            tokens = self.meter.completion_tokens if self.meter is not None else 0
        seconds = last - self.start
        tokens = min(tokens, self.ceiling, int(MAX_TPS * max(seconds, 0.0)))
        return Outcome(tokens, seconds, first - self.start, error)


@dataclass(frozen=True, slots=True)
class Failed:
    """An attempt that failed before its first byte; `kind` is what the statistics record,
    `code` the reason the `routes` list gives when it says more (a provider's `http_401`)."""

    kind: ErrorKind
    reason: str
    held: tuple[Message, ...] = ()  # the failing answer, held back from the client (annotate)
    retry_at: float | None = None  # unix time a node's 429 said to come back
    code: str = ""

    @property
    def why(self) -> str:
        """The route's reason in an exhaustion answer's `routes`."""
        return self.code or self.kind


def retry_at(value: bytes | str | None) -> float | None:
    """When a node's 429 `Retry-After` (seconds or an HTTP date) says to come back, as unix
    time; None when absent or unusable. A node is not trusted: a negative or garbage value is
    ignored, and a huge one capped at keys.RETRY_AFTER_MAX_S (an hour) by parse_retry_after,
    so no node can push a client away for longer."""
    if isinstance(value, bytes):
        value = value.decode("latin-1")
    now = time.time()
    seconds = parse_retry_after(value, now)
    return None if seconds is None else now + seconds


# A failure that is no attempt's: the deadline ran out before the next route was tried.
TOO_LATE = Failed("timeout", "no answer within the request's deadline")

# One attempt of a path, given its own context (an Exchange, a mitmproxy flow): None once it
# answered (and was settled), Failed to fall back.
RouteAttempt = Callable[[D, Measurement, T], Awaitable[Failed | None]]


class Ranking(Protocol[D]):
    """The routes of one request, in the order to try them, and what their attempts taught:
    the first route (the caller's: `Router.choose`, `ProviderRanking.first`), the next after
    a failure, record, cancel. `Attempts` is the mesh Router's own; the provider chain's is
    chat/providers/ranking.py."""

    @property
    def passed(self) -> list[PassedOver]:
        """The routes passed over so far, in order."""

    def decided(self, decision: D) -> None:
        """An attempt at `decision` starts."""

    def failed(self, decision: D, measurement: Measurement, failed: Failed) -> PassedOver:
        """Record an attempt that failed before its first byte; its entry in `routes`."""

    async def next(self, after: D, failed: Failed) -> D | None:
        """The route to try after `after` failed; None when there is none."""

    def cancel(self, decision: D) -> None:
        """An attempt ended without a record (the client left): it says nothing."""

    def exhaustion(self) -> Exhaustion:
        """No route answered: the exhaustion rule's answer for what was passed over."""

    def headers(self, last: D | None) -> Headers:
        """The `x-meshroute-*` headers of an answer that ends at `last`."""


class Attempts:
    """The attempts of one chat request, from the first decision to the last, within one
    deadline (a loop time: `asyncio.timeout_at(attempts.deadline)` bounds each wait), over
    the mesh Router's ranking (its own `Ranking` methods: fallbacks, records, cancels) unless
    given another (`ranking`: the provider chain's)."""

    __slots__ = ("_now", "_open", "_passed", "_ranking", "deadline", "hedge", "inputs", "kind",
                 "max_tokens", "measured", "model", "router", "telemetry", "text", "timeout_s")

    def __init__(self, router: Router, telemetry: Telemetry, model: str,
                 max_tokens: int | None = None, timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 deadline: float | None = None, *, kind: RequestKind = "chat",
                 inputs: int | None = None, ranking: Ranking[Any] | None = None) -> None:
        self.router, self.telemetry, self.model = router, telemetry, model
        self.max_tokens, self.timeout_s = max_tokens, timeout_s
        # what each attempt measures (Measurement): an embeddings request's inputs, a
        # completions stream's `text` tokens; `router` holds the kind's own statistics
        self.kind = kind
        self.inputs = inputs if kind == "embeddings" else None
        self.text = kind == "completions"
        self._ranking = ranking  # None: this object's own (no reference to itself: no cycle)
        self._passed: list[PassedOver] | None = None  # the mesh ranking's (on a failure)
        self._now = asyncio.get_running_loop().time  # the loop looked up once per request
        self.deadline = deadline if deadline is not None else self._now() + timeout_s
        self.measured: Measurement | None = None  # the last attempt's measurement
        self._open: list[Any] = []
        self.hedge: Hedge | None = None  # its hedge (chat/hedge.py), when it hedges

    @property
    def ranking(self) -> Ranking[Any]:
        """The ranking the attempts follow: the mesh Router's (this object) or another."""
        return self if self._ranking is None else self._ranking

    @ranking.setter
    def ranking(self, ranking: Ranking[Any]) -> None:
        self._ranking = None if ranking is self else ranking

    @property
    def passed(self) -> list[PassedOver]:
        """The routes passed over so far, in order."""
        if self._ranking is not None:
            return self._ranking.passed
        if self._passed is None:
            self._passed = []
        return self._passed

    def cut_at(self, seconds: float | None) -> float:
        """The loop time an attempt waiting at most `seconds` (None: no bound of its own)
        for its first byte is cut at: never past the request's deadline."""
        if seconds is None:
            return self.deadline
        return min(self.deadline, self._now() + seconds)

    def opened(self, decision: Any) -> None:
        """An attempt at `decision` began beside the loop's own (a hedge)."""
        self._open.append(decision)

    def too_late(self) -> bool:
        """Whether the request's deadline has run out."""
        return self._now() >= self.deadline

    async def run(self, first: D, attempt: RouteAttempt[D, T],
                  ctx: T, *, hedged: bool = True) -> tuple[D, Failed | None]:
        """Try `first` (its caller chose it within the deadline), then the ranked fallbacks
        while attempts fail before their first byte and the deadline allows; return the last
        decision and, if no route answered, the last failure (TOO_LATE when the deadline ran
        out between attempts). `hedged=False`: no hedge races here (a continuation runs
        inside the racer that won the request's race: chat/forward.py `_failover`)."""
        ranking = self.ranking
        decision = first
        while True:
            self._open.append(decision)
            ranking.decided(decision)
            if decision is not first and self.too_late():
                return decision, TOO_LATE
            measurement = self.measured = Measurement(self.max_tokens, inputs=self.inputs,
                                                      text=self.text)
            if self.hedge is None or not hedged:
                failed = await attempt(decision, measurement, ctx)
            else:  # raced beside a hedge: the lifecycle goes on from what the race says
                decision, measurement, failed = await self.hedge.race(
                    self, decision, measurement, attempt, ctx)
                self.measured = measurement
            if failed is None:
                return decision, None
            ranking.passed.append(ranking.failed(decision, measurement, failed))
            following = await ranking.next(decision, failed)
            if following is None:
                return decision, failed
            decision = following

    # -- the mesh Router's ranking ----------------------------------------------------------
    def decided(self, decision: Decision) -> None:
        self.telemetry.decided(decision)

    def failed(self, decision: Decision, measurement: Measurement,
               failed: Failed) -> PassedOver:
        if failed.kind == CONTEXT:  # the request's size, refused: nothing of the route
            self.router.cancel(decision)
        else:
            self.record(decision, measurement.failure(failed.kind))
        return PassedOver(decision.signature, failed.why, failed.retry_at)

    async def next(self, after: Decision, failed: Failed) -> Decision | None:
        return self.router.fallback(after)

    def cancel(self, decision: Decision) -> None:
        self.router.cancel(decision)

    def exhaustion(self) -> Exhaustion:
        return by_rule(self.model, self.passed, time.time())

    def headers(self, last: Decision | None) -> Headers:
        return [] if last is None else response_headers(last)

    def record(self, decision: Decision, outcome: Outcome) -> None:
        """Record a finished mesh attempt and tell the world."""
        result = self.router.record(decision, outcome)
        self.telemetry.finished(decision, outcome, result, self.kind)

    def settle(self, decision: Decision, measurement: Measurement,
               error: ErrorKind | Literal[""] = "", *,
               status: int | None = None, gone: bool = False) -> None:
        """Record an attempt that answered, or cancel it if it says nothing of the route."""
        client_error = status is not None and 400 <= status < 500
        if self.hedge is not None and self.hedge.lost(decision):
            return  # cancelled by the hedge's race, which settled it
        if client_error or (gone and measurement.first is None):
            self.router.cancel(decision)
        else:
            self.record(decision, measurement.outcome(error))

    def close(self) -> None:
        """Whatever ended abnormally leaves the in-flight count (ending twice counts once)."""
        for decision in self._open:
            self.ranking.cancel(decision)

    def exhausted(self, failed: Failed | None) -> tuple[ErrorAnswer, Headers]:
        """No route answered: why, route by route, and the headers beyond the body (a 429's
        `Retry-After`, when known); 504 once the deadline ran out."""
        if failed is TOO_LATE or self.too_late():
            log.warning("meshroute: a request for %r ran out of its %g s deadline",
                        self.model, self.timeout_s)
            self.telemetry.reject("request_timeout", "the request's deadline ran out")
            return ErrorAnswer.of(DeadlineExceeded(
                "no route answered within the request's deadline of "
                f"{self.timeout_s:g} s", firsts(self.passed))), []
        exhausted = self.ranking.exhaustion()
        retry = exhausted.retry_after_s
        return (exhaustion_answer(exhausted),
                [] if retry is None else [(b"retry-after", str(retry).encode())])

    def retry_after_s(self) -> int | None:
        """The soonest any route passed over said to come back (whole seconds); None when
        none said."""
        return by_rule(self.model, self.passed, time.time()).retry_after_s

    async def send_exhausted(self, send: Send, last: Any, failed: Failed | None) -> None:
        """No route answered: say so, route by route (a 429 with `Retry-After` when known)."""
        answer, headers = self.exhausted(failed)
        await answer.send(send, [*self.ranking.headers(last), *headers])


async def internal_error(ex: Exchange, doing: str,
                         headers: Iterable[tuple[bytes, bytes]] = ()) -> bool:
    """A bug of ours while `doing`: logged, and the client gets the JSON 500 (True) unless
    its answer had started (False: the caller re-raises, the server aborts the response).
    The forwarder closed under the answer is no bug: `closed_under`."""
    if isinstance(sys.exc_info()[1], ForwarderClosed):
        return await closed_under(ex, headers)
    log.exception("meshroute: internal error while %s", doing)
    if ex.started:
        return False
    await INTERNAL_ERROR.send(ex.send, headers)
    return True


async def closed_under(ex: Exchange, headers: Iterable[tuple[bytes, bytes]] = ()) -> bool:
    """The gateway closed its upstream connections under this request (it stops): one info
    line, and the client's answer ends as a drain's cut ends it: a 503 `shutting_down` when
    nothing was sent, a stream's error event; an answer that is not a stream is left
    unfinished (never passed off as complete). True: handled."""
    log.info("meshroute: a %s answer was cut: the gateway closed its upstream connections",
             "streamed" if ex.req.stream else "whole")
    try:
        if not ex.started:
            await HttpError.SHUTTING_DOWN.send(ex.send, SHUTTING_DOWN_MESSAGE, headers)
        elif ex.req.stream:
            await ex.send({"type": "http.response.body", "more_body": False,
                           "body": sse_error_event(f"{SHUTTING_DOWN_MESSAGE}; partial "
                                                   "response", "shutting_down")})
    except OSError:  # the client left meanwhile
        ex.gone = True
    return True
