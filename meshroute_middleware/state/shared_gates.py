"""`SharedGates`: the `KeyGates` a ProviderRouter is given when its gates live in a
LimitsStore (state/limits.py).

Taking a key goes to the store (`acquire`, awaited); settling, cooldowns, revocations and
clears are applied there too, before this process takes its next key; what the chain endpoint
and the scores read is the rows the store last gave back. A store that fails (down, locked past
its busy timeout) is left for RETRY_S: meanwhile decisions run on local gates that start from
the rows the store last gave back and admit this tracker only its share of every limit (the
limit divided by the trackers that used the store in the last minute: each tracker says so
every HEARTBEAT_S while it runs, requests or not, so the count an outage divides by is the
last minute's, not the one of this tracker's last request), with one warning,
`meshroute_limits_store_up 0` and a counter of those decisions. What they took and settled is
written back to the store, before anything else, when it answers again. docs/providers.md,
"Several workers, several trackers".
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from meshroute_middleware.core.providers.chain import Candidate
from meshroute_middleware.core.providers.config import Provider, ProviderModel, ProvidersConfig
from meshroute_middleware.core.providers.exhaustion import PassedOver
from meshroute_middleware.core.providers.keys import (
    KeyGates,
    Refusal,
    Reservation,
    RowName,
    Snapshot,
    route_name,
    rows_of_route,
)
from meshroute_middleware.core.providers.router import ChainAttempt, ProviderRouter
from meshroute_middleware.state.limits import LimitsStore, LimitsStoreDown, Outcome

log = logging.getLogger("meshroute.limits")
T = TypeVar("T")
RETRY_S = 1.0  # a failed store is tried again after this (decisions meanwhile run locally)
HEARTBEAT_S = 1.0  # how often a tracker says it uses the store (and counts who else does)
MAX_QUEUED = 1024  # changes waiting for an async store; past it the store counts as failed
MAX_OWED = 100_000  # local decisions kept for the store; past it the oldest are dropped
LATENCY_BUCKETS_S = (0.0001, 0.0003, 0.001, 0.003, 0.01, 0.1, math.inf)


class SharedGates(KeyGates):
    """Key gates whose state lives in a LimitsStore; this object holds the rows last seen."""

    def __init__(self, cfg: ProvidersConfig, store: LimitsStore, tracker: str,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        super().__init__()
        self.cfg, self.store, self.tracker, self.clock = cfg, store, tracker, clock
        self._sleep = sleep
        self.up = True
        self.fallback_decisions = 0  # decisions taken on local gates while the store was away
        self.failures = 0
        self.trackers = 1  # trackers that used the store in the last minute, as last counted
        self.latency = [0] * len(LATENCY_BUCKETS_S)  # store transactions by duration
        self.latency_sum_s = 0.0
        self._local: KeyGates | None = None  # the fallback gates while the store is away
        self._retry_at = -math.inf
        self._beat_at = -math.inf
        self._ids = secrets.randbits(40) << 22  # reservation ids unique across processes
        self._queue: deque[tuple[list[RowName], Callable[[KeyGates], Any], float]] = deque()
        self._drainer: asyncio.Task[None] | None = None
        # decisions taken locally, to write back: rows, the change, when, its first id
        self._owed: deque[tuple[list[RowName], Callable[[KeyGates], Any], float, int]] = deque()
        self.owed_dropped = 0
        self._writing = asyncio.Lock()  # one write-back at a time (each entry once)

    @property
    def mode(self) -> str:  # type: ignore[override]
        return self.store.mode if self.up else "local"

    # -- taking a key (awaited: the one decision that must be the store's) ----------------

    async def acquire(self, router: ProviderRouter, candidate: Candidate, tokens: int,
                      now: float, context_tokens: int | None = None,
                      prefer: tuple[int, ...] = ()) -> ChainAttempt | list[PassedOver]:
        """`ProviderRouter.acquire`, with the key taken in the store."""
        early = router.admit(candidate, tokens, context_tokens)
        if early is not None or candidate.provider is None or candidate.model is None:
            return early or ChainAttempt(candidate)
        taken = await self.atake(candidate.provider, candidate.model, tokens, now, prefer)
        return router.taken(candidate, *taken)

    async def atake(self, provider: Provider, model: ProviderModel, tokens: int, now: float,
                    prefer: tuple[int, ...] = ()) -> tuple[Reservation | None,
                                                           list[tuple[int, Refusal]]]:
        """`take` in the store, after everything this process applied before it."""
        if self._drainer is not None and not self._drainer.done():
            await asyncio.shield(self._drainer)

        def op(g: KeyGates) -> tuple[Reservation | None, list[tuple[int, Refusal]]]:
            return g.take(provider, model, tokens, now, prefer)

        if self._usable(now) and await self._write_back(now):
            try:  # no heartbeat here: `heartbeats` says it, off the request path
                return self._took(await self._timed(self.store.transact(
                    rows_of_route(provider, model), op, now, self._next_ids())))
            except LimitsStoreDown as exc:
                self._lost(exc, now)
        return self._take_locally(provider, model, tokens, now, prefer)

    def take(self, provider: Provider, model: ProviderModel, tokens: int, now: float,
             prefer: tuple[int, ...] = ()) -> tuple[Reservation | None, list[tuple[int, Refusal]]]:
        """A blocking store's take (ProviderRouter.acquire); an async store's needs acquire."""
        if not self.store.blocking:
            raise RuntimeError("this limits store is taken with `await SharedGates.acquire`")
        if self._usable(now) and self._write_back_now(now):
            started = time.perf_counter()
            try:
                return self._took(self.store.transact_now(
                    rows_of_route(provider, model),
                    lambda g: g.take(provider, model, tokens, now, prefer), now,
                    self._next_ids()))
            except LimitsStoreDown as exc:
                self._lost(exc, now)
            finally:
                self._count(time.perf_counter() - started)
        return self._take_locally(provider, model, tokens, now, prefer)

    def _take_locally(self, provider: Provider, model: ProviderModel, tokens: int, now: float,
                      prefer: tuple[int, ...] = ()) -> tuple[Reservation | None,
                                                             list[tuple[int, Refusal]]]:
        """`take` on the local gates; a key taken is owed to the store (reserved there)."""
        self.fallback_decisions += 1
        got = self._fallback(now).take(provider, model, tokens, now, prefer)
        reservation = got[0]
        if reservation is not None:
            key = reservation.key
            self._owe(rows_of_route(provider, model),
                      lambda g: g.reserve(provider, model, key, tokens, now), now,
                      reservation.id - 1)
        return got

    # -- what is applied (in order, before this process's next take) ----------------------

    def settle(self, reservation: Reservation, used_tokens: int | None, now: float) -> None:
        rows: list[RowName] = [("windows", reservation.provider, reservation.key),
                               ("keys", reservation.route, reservation.key)]
        self._apply(rows, lambda g: g.settle(reservation, used_tokens, now), now,
                    lambda g: g.settle(reservation, used_tokens, now))

    def rate_limited(self, route: str, key: int, retry_after_s: float | None,
                     now: float) -> float:
        local = super().rate_limited(route, key, retry_after_s, now)
        got = self._apply([("keys", route, key)],
                          lambda g: g.rate_limited(route, key, retry_after_s, now), now,
                          lambda g: g.rate_limited(route, key, retry_after_s, now))
        return local if got is None else got

    def succeeded(self, route: str, key: int) -> None:
        """Ends the ladder; skipped when the rows this process's take just read had none."""
        state = self._routes.get((route, key))
        if state is None or not state.strikes:
            return
        self._apply([("keys", route, key)], lambda g: g.succeeded(route, key), self.clock(),
                    lambda g: g.succeeded(route, key))

    def revoke(self, provider: str, model_id: str, key: int, status: int,
               now: float = 0.0) -> None:
        super().revoke(provider, model_id, key, status, now)
        name = provider if status == 401 else route_name(provider, model_id)
        self._apply([("revoked", name, key)],
                    lambda g: g.revoke(provider, model_id, key, status), self.clock(),
                    lambda g: g.revoke(provider, model_id, key, status))

    def clear(self, route: str | None = None, key: int | None = None,
              now: float | None = None) -> int:
        local = super().clear(route, key)
        rows = self._rows_to_clear(route, key)
        got = self._apply(rows, lambda g: g.clear(route, key), self.clock(),
                          lambda g: g.clear(route, key))
        return local if got is None else got

    # -- who else uses the store --------------------------------------------------------

    async def beat(self, now: float) -> None:
        """Say this tracker uses the store, and count the trackers that did in the last
        minute (at most every HEARTBEAT_S; nothing while the store is away: the count an
        outage divides limits by stays the last one read)."""
        if not self._usable(now) or now - self._beat_at < HEARTBEAT_S:
            return
        self._beat_at = now
        try:
            self.trackers = max(1, await self.store.heartbeat(self.tracker, now))
        except LimitsStoreDown as exc:
            self._lost(exc, now)

    async def heartbeats(self) -> None:
        """`beat` every HEARTBEAT_S while the gateway runs (a background service of its
        lifespan: app/services.py), so that a tracker idle since another came still counts
        it."""
        while True:
            await self.beat(self.clock())
            await self._sleep(HEARTBEAT_S)

    # -- what the chain endpoint and the scores read --------------------------------------

    async def refresh(self, now: float) -> None:
        """Fetch every route's rows (the chain endpoint, a clear): what other processes did."""
        if not self._usable(now):
            return
        rows = [r for p in self.cfg.providers for m in p.models for r in rows_of_route(p, m)]
        if self._drainer is not None and not self._drainer.done():
            await asyncio.shield(self._drainer)
        try:
            self._took(await self._timed(self.store.transact(rows, _read, now, 0)))
        except LimitsStoreDown as exc:
            self._lost(exc, now)

    def snapshot(self, now: float, *, changed_only: bool = False,
                 shared: bool = False) -> Snapshot:
        """Nothing for the state file's own writer: the store holds these rows itself."""
        super().snapshot(now, changed_only=changed_only, shared=shared)
        return {"windows": [], "keys": []}

    def metric_families(self) -> Iterator[Metric]:
        """The store's health and latency, for /metrics."""
        up = GaugeMetricFamily("meshroute_limits_store_up",
                               "1 while the shared limits store answers, 0 while provider "
                               "keys are gated locally on this tracker's share",
                               labels=["store"])
        up.add_metric([self.store.mode], 1 if self.up else 0)
        fallback = CounterMetricFamily("meshroute_limits_fallback_decisions",
                                       "Key decisions taken on local gates (this tracker's "
                                       "share of each limit) while the store was away")
        fallback.add_metric([], self.fallback_decisions)
        failures = CounterMetricFamily("meshroute_limits_store_failures",
                                       "Limits store transactions that failed")
        failures.add_metric([], self.failures)
        trackers = GaugeMetricFamily("meshroute_limits_trackers",
                                     "Trackers that used the limits store in the last minute")
        trackers.add_metric([], self.trackers)
        yield from (up, fallback, failures, trackers, self._latency_family())

    # -- internals ------------------------------------------------------------------------

    def _latency_family(self) -> Metric:
        family = HistogramMetricFamily("meshroute_limits_store_seconds",
                                       "Time of one limits store transaction")
        cumulative, buckets = 0, []
        for bound, n in zip(LATENCY_BUCKETS_S, self.latency, strict=True):
            cumulative += n
            buckets.append(("+Inf" if math.isinf(bound) else repr(bound), cumulative))
        family.add_metric([], buckets, self.latency_sum_s)
        return family

    async def _timed(self, work: Awaitable[T]) -> T:
        started = time.perf_counter()
        try:
            return await work
        finally:
            self._count(time.perf_counter() - started)

    def _count(self, seconds: float) -> None:
        self.latency_sum_s += seconds
        self.latency[next(i for i, b in enumerate(LATENCY_BUCKETS_S) if seconds <= b)] += 1

    def _took(self, outcome: Outcome[T]) -> T:
        """A store transaction went through: the rows it gave back are what this one shows."""
        if not self.up:
            log.warning("limits store (%s) answers again: provider keys are gated there "
                        "again (%d decisions were taken locally meanwhile, written back)",
                        self.store.mode, self.fallback_decisions)
            self.up, self._local = True, None
        KeyGates.restore(self, outcome.rows)
        return outcome.result

    def _lost(self, exc: Exception, now: float) -> None:
        self.failures += 1
        self._retry_at = now + RETRY_S
        if self.up:
            self.up = False
            log.warning("limits store (%s) failed (%s): provider keys are gated locally on "
                        "this tracker's share (1/%d of each limit) until it answers again",
                        self.store.mode, exc, self.trackers)

    def _usable(self, now: float) -> bool:
        return self.up or now >= self._retry_at

    def _fallback(self, now: float) -> KeyGates:
        """The local gates: this tracker's share (1/trackers) of what each limit had left in
        the rows last read."""
        if self._local is None:
            self._local = KeyGates(first_id=self._next_ids(), share=self.trackers)
            self._local.restore(shared_part(KeyGates.snapshot(self, now, shared=True),
                                            self.trackers))
        return self._local

    def _next_ids(self) -> int:
        self._ids += 1 << 10  # room for the reservations of one decision
        return self._ids

    def _apply(self, rows: list[RowName], op: Callable[[KeyGates], T], now: float,
               fallback: Callable[[KeyGates], T]) -> T | None:
        """Apply a change in the store: at once (blocking store; its result), or queued
        before this process's next take (None). Locally while the store is away."""
        if not self._usable(now):
            return self._locally(rows, op, now, fallback)
        if not self.store.blocking:
            if len(self._queue) >= MAX_QUEUED:  # a store too slow to keep up is failing
                self._lost(LimitsStoreDown(f"{MAX_QUEUED} changes waiting for the store"), now)
                return self._locally(rows, op, now, fallback)
            self._queue.append((rows, op, now))
            if self._drainer is None or self._drainer.done():
                self._drainer = asyncio.get_running_loop().create_task(self._drain())
            return None
        if not self._write_back_now(now):
            return self._locally(rows, op, now, fallback)
        started = time.perf_counter()
        try:
            return self._took(self.store.transact_now(rows, op, now, self._next_ids()))
        except LimitsStoreDown as exc:
            self._lost(exc, now)
            return self._locally(rows, op, now, fallback)
        finally:
            self._count(time.perf_counter() - started)

    def _locally(self, rows: list[RowName], op: Callable[[KeyGates], T], now: float,
                 fallback: Callable[[KeyGates], T]) -> T:
        """A change applied on the local gates, and owed to the store."""
        self._owe(rows, op, now, 0)
        return fallback(self._fallback(now))

    def _owe(self, rows: list[RowName], op: Callable[[KeyGates], Any], now: float,
             first_id: int) -> None:
        if len(self._owed) >= MAX_OWED:
            self._owed.popleft()
            self.owed_dropped += 1
            if self.owed_dropped == 1:
                log.error("limits: more than %d local decisions wait for the store: the "
                          "oldest are dropped", MAX_OWED)
        self._owed.append((rows, op, now, first_id))

    async def _write_back(self, now: float) -> bool:
        """Write what was decided locally to the store, in order; whether all of it went."""
        if not self._owed:
            return True
        async with self._writing:
            while self._owed:
                rows, op, at, first_id = self._owed[0]
                try:
                    self._took(await self._timed(self.store.transact(
                        rows, op, at, first_id or self._next_ids())))
                except LimitsStoreDown as exc:
                    self._lost(exc, now)
                    return False
                self._owed.popleft()
        return True

    def _write_back_now(self, now: float) -> bool:
        """`_write_back` for a blocking store, at once."""
        while self._owed:
            rows, op, at, first_id = self._owed[0]
            try:
                self._took(self.store.transact_now(rows, op, at, first_id or self._next_ids()))
            except LimitsStoreDown as exc:
                self._lost(exc, now)
                return False
            self._owed.popleft()
        return True

    async def _drain(self) -> None:
        while self._queue:
            rows, op, now = self._queue[0]
            try:
                if not self._usable(now) or not await self._write_back(now):
                    self._locally(rows, op, now, op)
                else:
                    self._took(await self._timed(self.store.transact(rows, op, now,
                                                                     self._next_ids())))
            except LimitsStoreDown as exc:
                self._lost(exc, now)
                self._locally(rows, op, now, op)
            except Exception:  # a bug of ours: logged, the queue goes on
                log.exception("limits: a queued change failed")
            finally:
                self._queue.popleft()

    def _rows_to_clear(self, route: str | None, key: int | None) -> list[RowName]:
        rows: list[RowName] = []
        for p in self.cfg.providers:
            for m in p.models:
                name = route_name(p.name, m.id)
                if route is None or route == name:
                    rows += [r for r in rows_of_route(p, m)
                             if r[0] in ("keys", "revoked") and (key is None or r[2] == key)]
        return sorted(set(rows))


def shared_part(rows: Snapshot, share: int) -> Snapshot:
    """`rows` with every count divided by `share` (rounded up): on gates that admit 1/share
    of each limit, what is left to this tracker is 1/share of what the limit had left. A
    window's 1-second buckets are divided together (each the rise of its running total's
    share), so that 10 requests over buckets of 3 and 7 are 5 of a half, not 2 + 4; so are
    its reservations in flight (five of 5 tokens are 13 of a half, not 5 x 3)."""
    if share <= 1:
        return rows

    def part(n: Any) -> int:
        return -(-int(n) // share)

    def parts(items: list[list[Any]]) -> list[list[Any]]:
        """Each [name, count, ...] with its count the rise of the running total's share."""
        out, total, shown = [], 0, 0
        for name, n, *rest in items:
            total += int(n)
            out.append([name, part(total) - shown, *rest])
            shown = part(total)
        return out

    out: Snapshot = dict(rows)
    out["windows"] = [{**r, "requests": parts(r["requests"]), "tokens": parts(r["tokens"]),
                       "day_requests": part(r["day_requests"]),
                       "day_tokens": part(r["day_tokens"]),
                       "inflight": parts(list(r.get("inflight", ())))}
                      for r in rows.get("windows", [])]
    out["keys"] = [{**r, "month_tokens": part(r["month_tokens"])} for r in rows.get("keys", [])]
    return out


def _read(gates: KeyGates) -> None:
    """A transaction that only reads (the rows come back in its Outcome)."""
    return None
