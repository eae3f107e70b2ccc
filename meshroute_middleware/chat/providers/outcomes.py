"""A chain's attempt outcomes, recorded in the ProviderRouter and published as telemetry."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from meshroute_middleware.core.objectives import DEFAULT_OBJECTIVE, Objective
from meshroute_middleware.core.providers.exhaustion import PassedOver
from meshroute_middleware.core.providers.keys import Reservation
from meshroute_middleware.core.providers.router import ChainAttempt, ProviderRouter
from meshroute_middleware.core.providers.scoring import OutcomeKind
from meshroute_middleware.telemetry.metrics import Telemetry, provider_outcome


class ChainOutcomes:
    """Records each attempt once: a cancelled attempt whose outcome was recorded already
    does not settle its reservation twice."""

    def __init__(self, providers: ProviderRouter, telemetry: Telemetry,
                 clock: Callable[[], float], min_sample_tokens: int,
                 kind: str = "chat") -> None:
        self.providers, self.telemetry, self.clock = providers, telemetry, clock
        self.min_sample_tokens = min_sample_tokens
        self.kind = kind  # "embeddings": its events' tps is inputs per second
        self._settled: set[Reservation] = set()  # recorded attempts still under way
        # provider attempts under way: (chain, attempt number, perf_counter at the start,
        # the request's objective)
        self._live: dict[ChainAttempt, tuple[str, int, float, Objective]] = {}

    def begin(self, got: ChainAttempt, chain: str, number: int,
              objective: Objective = DEFAULT_OBJECTIVE) -> None:
        """A provider key attempt starts (published; its outcome will be too)."""
        self._live[got] = (chain, number, time.perf_counter(), objective)
        self.telemetry.provider_decided(chain, got.candidate.route, got.route, number,
                                        objective)

    def cancelled(self, got: ChainAttempt) -> None:
        """The client left: settle the reservation, blame nobody."""
        if not got.reservation or got.reservation not in self._settled:
            self.providers.record(got, OutcomeKind.CLIENT_ERROR, self.clock())

    def end(self, got: ChainAttempt) -> None:
        """The attempt is over, whatever its outcome."""
        self._live.pop(got, None)
        if got.reservation is not None:
            self._settled.discard(got.reservation)

    def record(self, got: ChainAttempt, kind: OutcomeKind, *, completion_tokens: int = 0,
               **kw: Any) -> PassedOver | None:
        """The ProviderRouter's record; a provider attempt's outcome is published too."""
        if got.reservation is not None:
            self._settled.add(got.reservation)
        over = self.providers.record(got, kind, self.clock(), **kw)
        live = self._live.get(got)
        if live is not None:  # a mesh entry's own attempts published themselves
            self.telemetry.provider_finished(
                live[0], got.candidate.route, got.route, live[1],
                *provider_outcome(kind, over, completion_tokens,
                                  time.perf_counter() - live[2], kw.get("ttfb_ms"),
                                  sampled=kw.get("tokens_per_s") is not None),
                kind=self.kind, objective=live[3])
        return over

    def failed(self, got: ChainAttempt, reason: str, session: str | None) -> PassedOver | None:
        return self.record(got, OutcomeKind.FAILURE, reason=reason, session=session)

    def key_refused(self, got: ChainAttempt, status: int) -> PassedOver:
        """The provider refused the key (401/403): out of rotation, the next key is tried."""
        if got.reservation is not None:
            self._settled.add(got.reservation)
        return self.providers.key_refused(got, status, self.clock())

    def tps(self, tokens: int, seconds: float) -> float | None:
        """A tok/s sample, when the answer had enough tokens to be one (as on the mesh)."""
        return tokens / seconds if tokens >= self.min_sample_tokens else None
