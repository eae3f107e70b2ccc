"""A provider chain's ranking for the one attempt lifecycle (chat.attempts.Attempts): the
ProviderRouter's order over provider keys and mesh models, a candidate's next key after a
429 or a refused key, one wait for the soonest key reset (`wait_for_key_s`), and every
attempt's outcome recorded in the ProviderRouter and published — once."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from meshroute_middleware.chat.attempts import Failed, Measurement
from meshroute_middleware.chat.headers import Headers
from meshroute_middleware.chat.providers.request import ChainRequest
from meshroute_middleware.core.prefix import Prefix
from meshroute_middleware.core.providers.affinity import (
    Held,
    Turn,
    Verdict,
    key_order,
    preferred,
    refused_verdict,
)
from meshroute_middleware.core.providers.chain import Candidate, Resolution, mesh_fit
from meshroute_middleware.core.providers.exhaustion import Exhaustion, PassedOver
from meshroute_middleware.core.providers.keys import key_route
from meshroute_middleware.core.providers.router import ChainAttempt, MeshServes, ProviderRouter
from meshroute_middleware.core.providers.scoring import OutcomeKind
from meshroute_middleware.telemetry.events import TAP, as_is
from meshroute_middleware.telemetry.metrics import Telemetry, provider_outcome

log = logging.getLogger("meshroute.providers")
WAIT_MARGIN_S = 0.05  # slept past the soonest key reset before trying again
_NEXT_KEY = frozenset({"http_429", "http_401", "http_403"})  # the key failed: try the next key
_REFUSED = {"http_401": 401, "http_403": 403}
_SYSTEM = frozenset({"system", "developer"})  # a prompt's leading instructions, not its talk
# Shared key gates take a key in their store (awaited): (candidate, reserve, now, context need,
# the keys to try in order)
Acquire = Callable[[Candidate, int, float, int, tuple[int, ...]],
                   Awaitable[ChainAttempt | list[PassedOver]]]
# One attempt at a taken route (a provider call, a mesh entry)
ChainCall = Callable[[ChainRequest, ChainAttempt, "ProviderRanking", Measurement],
                     Awaitable[Failed | None]]


class ProviderRanking:
    """The routes of one chain request, as `Attempts.run` walks them; `gates` is the
    ProviderRouter whose key gates and budgets every lane shares, `providers` the lane's
    (whose statistics rank and record)."""

    def __init__(self, cr: ChainRequest, res: Resolution, providers: ProviderRouter,
                 gates: ProviderRouter, telemetry: Telemetry, *, passed: list[PassedOver],
                 clock: Callable[[], float], rng: random.Random, acquire: Acquire | None,
                 serves: MeshServes, min_sample_tokens: int, kind: str,
                 call: ChainCall, mesh: ChainCall) -> None:
        self.cr, self.res, self.providers, self.gates = cr, res, providers, gates
        self.telemetry, self.clock, self.rng, self._acquire = telemetry, clock, rng, acquire
        self.serves, self.min_sample_tokens, self.kind = serves, min_sample_tokens, kind
        self._call, self._mesh = call, mesh
        self._passed = passed  # capability first; then each pass-over in order
        self._earlier: list[PassedOver] = []  # the first round's, after a wait for a key
        self._waited = False
        self._recorded: set[ChainAttempt] = set()
        self._live: dict[ChainAttempt, tuple[int, float]] = {}  # provider attempts: n, start
        self.turn = conversation_turn(cr.ex.req.prefix, cr.payload.get("messages"), cr.prompt)
        self.affinity: str | None = None  # what became of the warm route (affinity.Verdict)
        self._held: Held | None = None
        self._ranked = self._rank()

    # -- the Ranking protocol -----------------------------------------------------------
    @property
    def passed(self) -> list[PassedOver]:
        return self._passed

    async def first(self) -> ChainAttempt | None:
        """The first route that can be taken; None when none can."""
        return await self._advance()

    def decided(self, got: ChainAttempt) -> None:
        self.cr.tally.tried.append(got.route)

    def failed(self, got: ChainAttempt, m: Measurement, failed: Failed) -> PassedOver:
        code = failed.why
        if code == "capability":  # its nodes changed since the chain was ranked
            over: PassedOver | None = PassedOver(got.candidate.route, code)
        elif code in _REFUSED:
            over = self.key_refused(got, _REFUSED[code])
        elif code == "http_429":
            retry = None if failed.retry_at is None else failed.retry_at - self.clock()
            over = self.outcome(got, OutcomeKind.RATE_LIMITED, retry_after_s=retry)
        elif code == "context":
            over = self.outcome(got, OutcomeKind.CLIENT_ERROR, reason="context")
        else:
            over = self.outcome(got, OutcomeKind.FAILURE, reason=code)
        over = over or PassedOver(got.route, code)
        log.info("providers: %s passed over (%s)", over.route, over.reason)
        return over

    async def next(self, after: ChainAttempt, failed: Failed) -> ChainAttempt | None:
        if self.cr.ex.started:  # a client error relayed as it was: the request is over
            return None
        if failed.why in _NEXT_KEY and after.candidate.is_provider:
            got = await self._take(after.candidate)
            if got is not None:
                return got
        return await self._advance()

    async def going_on(self, after: ChainAttempt,
                       keep: Callable[[Candidate], bool]) -> ChainAttempt | None:
        """The route to continue a stream `after` broke off (chat/failover.py): another key of
        its provider candidate, else the next ranked candidate `keep` accepts; None when none
        (a mesh entry tried its model's routes itself)."""
        again = after.candidate.is_provider and keep(after.candidate)
        got = await self._take(after.candidate, skip=after.key) if again else None
        for c in self._ranked if got is None else ():
            if keep(c) and (got := await self._take(c)) is not None:
                break
        return got

    def cancel(self, got: ChainAttempt) -> None:
        """The attempt ended without a record (the client left): settle its reservation,
        blame nobody."""
        if got.candidate.is_provider and got not in self._recorded:
            self._recorded.add(got)
            self.providers.record(got, OutcomeKind.CLIENT_ERROR, self.clock())

    def exhaustion(self) -> Exhaustion:
        return self.gates.exhausted(self.res, self.passed + self._earlier, self.clock())

    def headers(self, last: ChainAttempt | None) -> Headers:
        return self.cr.tally.headers()

    # -- the attempt and its record -------------------------------------------------------
    async def attempt(self, got: ChainAttempt, m: Measurement,
                      cr: ChainRequest) -> Failed | None:
        """One attempt at a taken route: a provider key's call or a mesh entry's attempts."""
        return await (self._call if got.candidate.is_provider else self._mesh)(cr, got, self, m)

    def begin(self, got: ChainAttempt) -> None:
        """A provider key attempt starts (published; its outcome will be too)."""
        tried = self.cr.tally.tried
        self._live[got] = (len(tried) - 1, time.perf_counter())
        self.telemetry.provider_decided(self.cr.tally.chain, got.candidate.route, got.route,
                                        len(tried) - 1, self.cr.objective)
        if (tap := TAP.get()) is not None and (verdict := self.kept(got)) is not None:
            tap((0, "affinity", 0.0, as_is, {"signature": got.route, "attempt": len(tried) - 1,
                                             "affinity": verdict}))

    def kept(self, got: ChainAttempt) -> str | None:
        """What affinity did for this attempt (a trace's `meshroute.affinity`): `kept` on
        the warm route's warm key, else why not (the ranking's verdict, or what befell the
        warm key in this request); None without a conversation."""
        held, verdict = self._held, self.affinity
        if held is None or verdict not in (Verdict.KEPT, None):
            return verdict
        if got.candidate.route == held.route and got.key == held.key:
            return Verdict.KEPT
        warm = key_route(held.route, held.key)
        why = next((p.reason for p in (*self._earlier, *self.passed) if p.route == warm), None)
        if why is not None:
            return refused_verdict(why)
        first = verdict == Verdict.KEPT and len(self.cr.tally.tried) == 1
        return Verdict.PINNED if first else None  # a pin or the session's route went first

    def outcome(self, got: ChainAttempt, kind: OutcomeKind, *, completion_tokens: int = 0,
                **kw: Any) -> PassedOver | None:
        """Record an attempt's outcome in the ProviderRouter; a provider attempt's is
        published too."""
        self._recorded.add(got)
        over = self.providers.record(got, kind, self.clock(), session=self.cr.session,
                                     turn=self.turn, **kw)
        live = self._live.get(got)
        if live is not None:  # a mesh entry's own attempts published themselves
            self.telemetry.provider_finished(
                self.cr.tally.chain, got.candidate.route, got.route, live[0],
                *provider_outcome(kind, over, completion_tokens, time.perf_counter() - live[1],
                                  kw.get("ttfb_ms"), sampled=kw.get("tokens_per_s") is not None),
                kind=self.kind, objective=self.cr.objective)
        return over

    def key_refused(self, got: ChainAttempt, status: int) -> PassedOver:
        """The provider refused the key (401/403): out of rotation, the next key is tried."""
        self._recorded.add(got)
        log.warning("providers: %s answered %d: key %s taken out of rotation until cleared "
                    "or restarted", got.route, status, got.key)
        return self.gates.key_refused(got, status, self.clock())

    def tps(self, tokens: int, seconds: float) -> float | None:
        """A tok/s sample, when the answer had enough tokens to be one (as on the mesh)."""
        return tokens / seconds if tokens >= self.min_sample_tokens else None

    # -- walking the ranking --------------------------------------------------------------
    def _rank(self) -> Iterator[Candidate]:
        cr = self.cr
        pin = cr.ex.req.pin[0] if cr.ex.req.pin else None
        ranked = self.providers.rank(
            self.res, self.clock(), self.rng, pinned=pin, session=cr.session,
            tokens=cr.context_need, needs=cr.ex.req.needs, mesh_serves=self.serves,
            objective=cr.objective, turn=self.turn)
        self.affinity = ranked.affinity
        self._held = self.providers.warm(self.turn, self.clock())[0]
        return iter([s.candidate for s in ranked])

    async def _advance(self) -> ChainAttempt | None:
        """The next candidate that can be taken: once more after a wait for a key reset."""
        while True:
            for c in self._ranked:
                got = await self._take(c)
                if got is not None:
                    return got
            if self._waited or not await self._wait_for_key():
                return None
            self._ranked = self._rank()

    async def _wait_for_key(self) -> bool:
        """Every key limited: wait for the soonest reset once, if the deadline allows."""
        cr = self.cr
        wait = self.gates.wait_for_key(self.passed, cr.started, self.clock())
        if wait is None or cr.time_to_deadline() <= wait:
            return False
        log.info("providers: every key of %r is limited; waiting %.1f s for one",
                 self.res.model, wait)
        # a hair past the reset: a wake-up exactly on it can still find the key limited
        await asyncio.sleep(min(wait + WAIT_MARGIN_S, cr.time_to_deadline()))
        self._waited = True
        self._earlier = self.passed[:]  # what the second round meets counts first
        self.passed.clear()
        return True

    async def _take(self, c: Candidate, skip: int | None = None) -> ChainAttempt | None:
        """Take `c` (a key through its gates, `skip` never), or None with why it was passed
        over."""
        cr = self.cr
        fit = mesh_fit(c, cr.prompt, cr.asked)
        if not fit.fits:  # larger than its [mesh.MODEL] allows: a route that fits, instead
            self.passed.append(PassedOver(c.route, "context"))
            log.info("providers: %s passed over (context: max_tokens %s, prompt ~%d tokens)",
                     c.route, cr.asked, cr.prompt)
            return None
        if (not self.gates.may_attempt(len(cr.tally.tried), cr.started, self.clock())
                or cr.opened[0].too_late()):
            return None
        prefer = self._key_order(c)
        if skip is not None and c.provider is not None:  # the keys after it, in turn
            n = len(c.provider.keys)
            order = prefer or tuple((skip + i) % n + 1 for i in range(n))
            prefer = tuple(k for k in order if k != skip)
            if not prefer:
                return None
        got = (self.gates.acquire(c, cr.reserve, self.clock(), context_tokens=cr.context_need,
                                  prefer=prefer)
               if self._acquire is None
               else await self._acquire(c, cr.reserve, self.clock(), cr.context_need, prefer))
        if isinstance(got, list):
            self._passed += got
            return None
        return got

    def _key_order(self, c: Candidate) -> tuple[int, ...]:
        """The conversation's keys of a provider route in the order to try them, its warm key
        first (core/providers/affinity.py); () for round-robin: no conversation, one key, or
        the provider's `cache_ttl` is 0."""
        provider, turn = c.provider, self.turn
        if turn is None or provider is None or len(provider.keys) < 2 or not provider.cache_ttl_s:
            return ()
        order = key_order(turn.conversation, c.route, len(provider.keys))
        return preferred(order, self.providers.warm(turn, self.clock())[0], c.route)


def conversation_turn(prefix: Prefix | None, messages: Any, prompt_tokens: int) -> Turn | None:
    """Who a chat request's conversation is (core/providers/affinity.py): its `x-session-id`,
    else its prompt through the first message after the leading system ones, which every
    turn repeats; None for a request with no messages."""
    if prefix is None or not prefix.hashes:
        return None
    if prefix.session:
        return Turn(prefix.session, prompt_tokens)
    lead = 0
    if isinstance(messages, list):
        while lead < len(messages) and isinstance(messages[lead], dict) \
                and messages[lead].get("role") in _SYSTEM:
            lead += 1
    return Turn(prefix.hashes[min(lead, len(prefix.hashes) - 1)], prompt_tokens)
