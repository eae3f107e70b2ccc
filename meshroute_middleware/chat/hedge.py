"""Hedged first tokens (issue 34): an attempt whose first byte has not come after its hedge
delay (core/hedging.py: a quantile of the route's learned first-byte times, or a fixed delay)
gets the next ranked route started beside it, and a hedge without its own first byte after
its own route's delay the route after that, up to MAX_RACERS routes racing; the first to
send the client a byte wins, and the others are cancelled, their upstream connections
closed.

The race runs inside the one attempt lifecycle (`Attempts.run` hands its attempt to
`Hedge.race`): both racers are ordinary attempts of the path (forward mode's), and they share
the exchange. The client's `send` is a `Gate` while they race: a racer's response start is
held back until its first body byte, and the first body byte decides the race. A racer that
fails before any byte is recorded as any failed attempt; the loser is cancelled and records
nothing (its first byte never came: its time says nothing of the route but that it was
slower). Each hedge is one more upstream request: it is counted against the gateway's cap
(`HedgeCap`), reserved against its client's limits and budget like any request (`Reserve`),
and released once the race is decided, charged a prompt when a racer lost (it reached an
upstream).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, Metric
from starlette.types import Message, Send

from meshroute_middleware.chat.attempts import Failed, Measurement, RouteAttempt
from meshroute_middleware.chat.deadlines import FirstByteDeadlines
from meshroute_middleware.chat.spend import ClientRefused, ClientSpend
from meshroute_middleware.core.hedging import MAX_RACERS, HedgeAfter, HedgeCap, HedgePlan
from meshroute_middleware.core.kinds import HEDGE
from meshroute_middleware.telemetry.events import EventBus

if TYPE_CHECKING:
    from meshroute_middleware.chat.attempts import Attempts, Exchange

log = logging.getLogger("meshroute.hedge")
_RACER: contextvars.ContextVar[int] = contextvars.ContextVar("meshroute_racer", default=-1)
HEDGED = Failed("timeout", "no first byte within the hedge delay")  # what `next` is told

# A hedge's reservation against its client's limits: None when refused (no hedge), else the
# release to call with the route it reached and whether it lost.
Reserve = Callable[["Exchange", bool], Awaitable["Release | None"]]
Release = Callable[[str | None], Awaitable[None]]


class Hedging:
    """A gateway's hedging: its plan, its cap, the first-byte times it learned per route (on
    the loop's clock, from an attempt's start to its first body byte), and what it counted
    (per hedge, `won` or `lost`: `meshroute_hedges_total{outcome}`)."""

    def __init__(self, plan: HedgePlan, reserve: Reserve | None = None,
                 events: EventBus | None = None) -> None:
        self.plan = plan
        self.events = events  # a `hedge` event as each hedge starts
        self.cap = HedgeCap(plan.max_share)
        self.first_bytes = FirstByteDeadlines()
        self.reserve = reserve
        self.counts: dict[str, int] = {"won": 0, "lost": 0}

    def metric_families(self) -> Iterator[Metric]:
        """`meshroute_hedges_total{outcome}`: hedges that won the race, and that lost it."""
        family = CounterMetricFamily("meshroute_hedges", "Hedged attempts by whether the "
                                     "hedge sent the first byte (won) or not (lost)",
                                     labels=["outcome"])
        for outcome, n in self.counts.items():
            family.add_metric([outcome], n)
        yield family

    def configure(self, plan: HedgePlan) -> None:
        """Hedge by `plan` from now on (a reload's); what was learned and counted stays."""
        if plan != self.plan:
            self.plan, self.cap.max_share = plan, plan.max_share

    def for_request(self, name: str, ex: Exchange, chain: bool = False) -> Hedge | None:
        """The hedge of one request for `name` (a mesh model; with `chain`, a provider
        chain: its hedges are priced as its routes are); None when it does not hedge."""
        after = self.plan.for_name(name)
        if after is None:
            return None
        self.cap.seen()
        return Hedge(self, after, ex, chain)


class Gate:
    """The client's send while attempts race: the first racer to send a body byte wins and
    calls `won`; its held response start goes first. A loser never sends."""

    __slots__ = ("held", "send", "winner", "won")

    def __init__(self, send: Send, won: Callable[[int], None]) -> None:
        self.send, self.won = send, won
        self.winner = -1
        self.held: dict[int, Message] = {}

    async def __call__(self, message: Message) -> None:
        racer = _RACER.get()
        if self.winner < 0:
            if message["type"] == "http.response.start":
                self.held[racer] = message
                return
            self.winner = racer
            self.won(racer)
            start = self.held.pop(racer, None)
            if start is not None:
                await self.send(start)
        elif racer != self.winner:
            raise asyncio.CancelledError  # never reached: the loser was cancelled first
        await self.send(message)


class _Racer:
    __slots__ = ("decision", "failed", "measurement", "started", "task")

    def __init__(self, decision: Any, measurement: Measurement, started: float) -> None:
        self.decision, self.measurement, self.started = decision, measurement, started
        self.task: asyncio.Task[Failed | None] | None = None
        self.failed: Failed | None = None


class Hedge:
    """One request's hedge: `race` runs an attempt, and hedges beside it while first bytes
    are late."""

    __slots__ = ("after", "chain", "ex", "hedging", "losers", "releases")

    def __init__(self, hedging: Hedging, after: HedgeAfter, ex: Exchange,
                 chain: bool = False) -> None:
        self.hedging, self.after, self.ex, self.chain = hedging, after, ex, chain
        self.losers: list[Any] = []  # decisions cancelled by the race: settled as nothing
        self.releases: list[Release] = []  # the hedges' reservations, while they race

    def lost(self, decision: Any) -> bool:
        """Whether `decision` lost a race (its settle records nothing)."""
        return any(d is decision for d in self.losers)

    async def _reserve(self) -> Release | None:
        reserve = self.hedging.reserve
        return _free if reserve is None else await reserve(self.ex, self.chain)

    def _delay_s(self, decision: Any) -> float | None:
        learned = median = None
        if self.after.quantile is not None:
            route, first_bytes = _route(decision), self.hedging.first_bytes
            learned = first_bytes.quantile_s(route, self.after.quantile)
            median = first_bytes.quantile_s(route, 0.5)
        return self.after.delay_s(learned, median)

    async def race(self, attempts: Attempts, decision: Any, measurement: Measurement,
                   attempt: RouteAttempt[Any, Any], ctx: Any
                   ) -> tuple[Any, Measurement, Failed | None]:
        """Run `attempt` at `decision`, hedged (each racer without its first byte after
        its route's delay gets the next route beside it, up to MAX_RACERS); return the
        decision the lifecycle goes on from (the winner, else the last one that failed), its
        measurement and its failure."""
        ex, loop = self.ex, asyncio.get_running_loop()
        racers: list[_Racer] = []
        send = ex.send

        def won(index: int) -> None:
            now = loop.time()
            for racer in racers:  # the winner's time, and a lower bound of each loser's
                if racer is racers[index] or (racer.task is not None
                                              and not racer.task.done()):
                    self.hedging.first_bytes.observe(_route(racer.decision),
                                                     now - racer.started)
                if racer is not racers[index] and racer.task is not None \
                        and not racer.task.done():
                    self.losers.append(racer.decision)
                    attempts.ranking.cancel(racer.decision)
                    racer.task.cancel()

        gate = Gate(send, won)
        ex.send = gate

        def start(d: Any, m: Measurement) -> _Racer:
            racer = _Racer(d, m, loop.time())
            context = contextvars.copy_context()
            context.run(_RACER.set, len(racers))
            racer.task = asyncio.create_task(_awaited(attempt, d, m, ctx), context=context)
            racers.append(racer)
            return racer

        try:
            latest: _Racer | None = start(decision, measurement)
            while latest is not None and len(racers) < MAX_RACERS:
                assert latest.task is not None
                delay = self._delay_s(latest.decision)  # None: a cold route is not hedged
                if delay is None or not self.hedging.cap.may():
                    break
                await asyncio.wait({latest.task}, timeout=max(0.0, min(
                    delay, attempts.deadline - loop.time())))
                if latest.task.done() or gate.winner >= 0:
                    break
                latest = await self._hedge(attempts, latest, gate, start)
            await _decided(racers, gate)
        finally:  # the race's end (the client leaving included): nothing left running
            for racer in racers:
                if racer.task is not None and not racer.task.done():
                    racer.task.cancel()
            await asyncio.gather(*(r.task for r in racers if r.task is not None),
                                 return_exceptions=True)
            ex.send = send
            ex.started = gate.winner >= 0  # a held start never reached the client
            try:
                outcome = self._outcome(attempts, racers, gate)  # the client leaving included
            finally:  # a racer's own exception re-raised there still releases the hedge
                await self._released(racers, gate)
        return outcome

    async def _hedge(self, attempts: Attempts, late: _Racer, gate: Gate,
                     start: Callable[[Any, Measurement], _Racer]) -> _Racer | None:
        """Start the next ranked route beside `late`'s, if the cap, the deadline and its
        client's limits allow and the race is still open once they said so (an admission
        may wait on the limits' store); the hedge's racer, else None."""
        if attempts.too_late() or not self.hedging.cap.may():
            return None
        ranking, decision = attempts.ranking, late.decision

        def decided() -> bool:
            return gate.winner >= 0 or (late.task is not None and late.task.done())
        release = await self._reserve()
        if release is None:  # its client is over a limit: no hedge
            return None
        try:  # a cut while the next route is chosen releases the reservation too
            following = None if decided() else await ranking.next(decision, HEDGED)
        except BaseException:
            await release(None)
            raise
        # the cap is taken only now (the waits above may have let others spend its credit)
        if following is None or decided() or not self.hedging.cap.take():
            if following is not None:
                ranking.cancel(following)
            await release(None)
            return None
        self.releases.append(release)
        if hasattr(following, "mode"):
            following.mode = HEDGE
        attempts.opened(following)
        ranking.decided(following)
        log.info("meshroute: %s has no first byte yet: hedged on %s", _route(decision),
                 _route(following))
        racer = start(following, Measurement(attempts.max_tokens, inputs=attempts.inputs,
                                             text=attempts.text))
        if self.hedging.events is not None:  # before the hedge's own route-selected event
            self.hedging.events.publish("hedge", {"model": attempts.model,
                                                  "signature": _route(following),
                                                  "after": _route(decision)})
        return racer

    def _outcome(self, attempts: Attempts, racers: list[_Racer],
                 gate: Gate) -> tuple[Any, Measurement, Failed | None]:
        """The race decided: each hedge counted (won: it sent the first byte), and each
        racer that failed before any byte recorded (the last one by the lifecycle, when none
        won)."""
        for index in range(1, len(racers)):
            self.hedging.counts["won" if gate.winner == index else "lost"] += 1
        last = racers[gate.winner] if gate.winner >= 0 else racers[-1]
        for racer in racers:
            if racer is not last and not self.lost(racer.decision):
                self._record_failure(attempts, racer)
        return last.decision, last.measurement, _result(last)

    async def _released(self, racers: list[_Racer], gate: Gate) -> None:
        """The hedges' reservations end: each charged as one request that lost (its prompt:
        it was cancelled after reaching its upstream), the rest as nothing."""
        releases, self.releases = self.releases, []
        losers = [_route(r.decision) for r in racers if self.lost(r.decision)]
        for k, release in enumerate(releases):
            try:
                await release(losers[k] if gate.winner >= 0 and k < len(losers) else None)
            except Exception:  # a bug of ours must not fail the answer already given
                log.exception("meshroute: releasing a hedge's reservation failed")

    @staticmethod
    def _record_failure(attempts: Attempts, racer: _Racer) -> None:
        if racer.task is None or racer.task.cancelled():  # the client left: says nothing
            return
        failed = _result(racer)
        if failed is not None:
            ranking = attempts.ranking
            ranking.passed.append(ranking.failed(racer.decision, racer.measurement, failed))


async def _decided(racers: list[_Racer], gate: Gate) -> None:
    """Until the winner's answer was relayed, or every racer failed."""
    pending = {r.task for r in racers if r.task is not None}
    while pending:
        _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        if gate.winner >= 0 and racers[gate.winner].task not in pending:
            return


async def _awaited(attempt: RouteAttempt[Any, Any], decision: Any, m: Measurement,
                   ctx: Any) -> Failed | None:
    return await attempt(decision, m, ctx)


async def _free(route: str | None) -> None:
    """The release of a hedge no client limit reserved."""


def client_reserve(spend: ClientSpend) -> Reserve:
    """Hedges reserved against their client's limits and budgets like any request (an
    admission of their own, ClientRefused: no hedge); a hedge that lost is settled as a
    request cancelled after reaching `route` (its prompt charged), else as nothing."""
    async def reserve(ex: Exchange, chain: bool) -> Release | None:
        client = ex.req.client
        if client is None:
            return _free
        req = replace(ex.req, reached=None)
        try:
            metered = await spend.admit(client, req, _nowhere, chain)
        except ClientRefused:
            return None

        async def release(route: str | None) -> None:
            req.reached = route
            await metered.close()
        return release
    return reserve


async def _nowhere(message: Message) -> None:
    """A hedge's own admission answers nobody."""


def _result(racer: _Racer) -> Failed | None:
    task = racer.task
    if task is None or task.cancelled():
        return HEDGED
    exc = task.exception()
    if exc is not None:
        raise exc
    return task.result()


def _route(decision: Any) -> str:
    """A racer's route: a mesh decision's signature, a chain attempt's key route."""
    route = getattr(decision, "signature", None) or getattr(decision, "route", "")
    return str(route)
