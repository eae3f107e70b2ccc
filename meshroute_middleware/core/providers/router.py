"""The provider-side router facade: resolve, rank, take a key, record, explain, persist.

One object holds the mutable state (key gates, learned statistics per route, sessions); the
clock and the rng come in on every call. The forward loop of the adapter uses it like this:

    res = router.resolve(model, mesh_models)          # 400 / 404 raise here
    passed = []
    for scored in router.rank(res, now, rng, pinned=pin, session=sid, tokens=est):
        got = router.acquire(scored.candidate, est, now)
        if isinstance(got, list):  passed += got; continue      # key gates said no
        ... send (got.key: the 1-based key position; None for a mesh route) ...
        over = router.record(got, kind, now, reason=..., used_tokens=..., retry_after_s=...)
        if over is None: return answer;  passed.append(over)
    return router.exhausted(res, passed, now)         # status, Retry-After, error body
"""

from __future__ import annotations

import random
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from ..capabilities import NO_NEEDS, UnsupportedCapabilityError
from ..errors import InvalidPinError, MeshRouteError
from ..objectives import COST, DEFAULT_OBJECTIVE, TTFT, Objective
from .affinity import (
    Affinity,
    FirstBytes,
    Held,
    Turn,
    Verdict,
    cache_discount,
    keeps,
    warm_refused,
)
from .chain import (
    Candidate,
    Resolution,
    Sessions,
    provider_candidate,
    resolve,
)
from .config import ProvidersConfig
from .exhaustion import (
    Exhaustion,
    PassedOver,
    attempt_reason,
    exhaustion,
    soonest_reset,
)
from .gossiped import Gossiped
from .keys import (
    KeyGates,
    Refusal,
    Reservation,
    Snapshot,
    key_route,
    split_key_route,
)
from .peers import Peers, merged_stats
from .ranked import MeshServes as MeshServes  # re-exported: its importers by the old path
from .ranked import Ranked, by_price, by_score, chain_view, has_caps, move_first
from .ranked import Scored as Scored
from .scoring import (
    PRIORITY,
    STRATEGY_WEIGHTS,
    OutcomeKind,
    RouteStats,
    combine,
    expected_reliability,
    first_token_score,
    headroom_factor,
    intelligence_score,
    price_score,
    rate_limit_factor,
    sample_first_token,
    sample_reliability,
    sample_speed,
    speed_score,
)

# Under the `cost` objective routes of one price are ranked as under this strategy (speed).
COST_TIES = "fastest"


@dataclass(frozen=True, slots=True)
class ChainAttempt:
    """A route taken: for a provider route, the key (1-based) and its reservation."""

    candidate: Candidate
    key: int | None = None
    reservation: Reservation | None = None

    @property
    def route(self) -> str:
        """`fastco/big-model#2` for a provider route, the model's name for a mesh route."""
        if self.key is None:
            return self.candidate.route
        return key_route(self.candidate.route, self.key)


class StateRestoreError(MeshRouteError, ValueError):
    """Stored state does not have the shape `snapshot()` writes."""


class ProviderRouter(Gossiped):
    """Ranks provider and mesh routes on the same axes and gates provider keys."""

    def __init__(self, cfg: ProvidersConfig, gates: KeyGates | None = None,
                 sessions: Sessions | None = None) -> None:
        self.cfg = cfg
        self.gates = gates or KeyGates()
        self.sessions = sessions or Sessions()
        self.stats: dict[str, RouteStats] = {}
        self._stats_dirty: set[str] = set()
        self.peers: Peers | None = None  # gossiping trackers' reports (core/providers/peers)
        self.affinity = Affinity()  # conversations' warm routes and keys (issue 35)
        self.first_bytes = FirstBytes()  # what a cache hit saves per provider route

    def resolve(self, model: str, mesh_models: Collection[str]) -> Resolution:
        return resolve(self.cfg, model, mesh_models)

    # -- ranking --------------------------------------------------------------------------

    def incapable(self, res: Resolution, needs: frozenset[str],
                  mesh_serves: MeshServes | None = None) -> list[PassedOver]:
        """The candidates passed over for reason `capability` (lacking some of `needs`);
        UnsupportedCapabilityError when that is every candidate."""
        if not needs or not res.candidates:
            return []
        passed = [PassedOver(c.route, "capability") for c in res.candidates
                  if not has_caps(c, needs, mesh_serves)]
        if len(passed) == len(res.candidates):
            have = frozenset().union(*(c.model.capabilities for c in res.candidates
                                       if c.model is not None))
            raise UnsupportedCapabilityError(res.model, (needs - have) or needs)
        return passed

    def score(self, candidate: Candidate, strategy: str, now: float,
              rng: random.Random | None = None,
              objective: Objective = DEFAULT_OBJECTIVE,
              turn: tuple[int, int] | None = None) -> Scored:
        """All axes of one route; reliability is a Thompson draw when `rng` is given (never
        under `priority`: its axes are shown, not ranked by, so no draw is spent). The
        `ttft` objective scores the first-token axis alone beside reliability; `cost` the
        COST_TIES strategy, which breaks ties of price (`rank` sorts by price first).
        `turn`: (prompt tokens, of them in this route's cache): the cached share is read at
        `price_cached_in`, and a provider route's first byte is expected at the turn's
        uncached tokens (affinity.FirstBytes)."""
        if strategy == PRIORITY:
            rng = None
        st = self.stats.get(candidate.route)
        if self.peers is not None:  # trackers gossiping: their experience counts too
            st = merged_stats(st, self.peers.stats(candidate.route), now)
        if st is None:
            st = RouteStats()
        ttfb_ms, warm_share = st.ttfb_ms, 0.0
        if turn is not None and candidate.is_provider:
            ttfb_ms = self.first_bytes.expected_ms(candidate.route, ttfb_ms, *turn)
            warm_share = min(turn[1] / turn[0], 1.0) if turn[0] > 0 else 0.0
        reliability = (expected_reliability(st.ok, st.fail) if rng is None
                       else sample_reliability(st.ok, st.fail, rng))
        first_token = objective == TTFT and strategy != PRIORITY
        if first_token:
            speed = (first_token_score(ttfb_ms) if rng is None
                     else sample_first_token(ttfb_ms, st.ok, rng))
        else:
            speed = (speed_score(st.tokens_per_s, ttfb_ms) if rng is None
                     else sample_speed(st.tokens_per_s, ttfb_ms, st.ok, rng))
        intelligence = intelligence_score(candidate.tier)
        model = candidate.model
        price = price_score(cache_discount(model.price_in, model.price_cached_in, warm_share),
                            model.price_out) if model else 1.0
        headroom = self._headroom(candidate, now)
        rate_limit = rate_limit_factor(st.penalty_now(now))
        total: float | None
        if strategy == PRIORITY:
            total = None
        elif first_token:
            total = reliability * speed * headroom * rate_limit
        else:
            weights = STRATEGY_WEIGHTS[COST_TIES if objective == COST else strategy]
            total = combine(weights, reliability, speed, intelligence, price, headroom,
                            rate_limit)
        return Scored(candidate, total, reliability, speed, intelligence, price, headroom,
                      rate_limit)

    def rank(self, res: Resolution, now: float, rng: random.Random | None = None, *,
             pinned: str | None = None, session: str | None = None,
             tokens: int = 0, needs: frozenset[str] = NO_NEEDS,
             mesh_serves: MeshServes | None = None,
             objective: Objective = DEFAULT_OBJECTIVE, turn: Turn | None = None) -> Ranked:
        """The order to try routes in: by score, then the conversation's warm route (unless
        another is better by more than its cache saves: `_keeps`), the session's route, then
        the pin first; its `affinity` says what became of the warm route (Verdict).
        With `needs`, only the routes having those capabilities (`mesh_serves` says it for a
        mesh model; without it a mesh model's own router decides).

        The request's `objective` (issue 26) overrides the strategy's ranking: `throughput`
        (the default) ranks as the strategy says; `ttft` by reliability × the first-token
        axis; `cost` by price (a mesh route is free), then as COST_TIES ranks, and no session
        reorders it. Under `priority`: the chain's written order whatever the objective,
        then the pin first; no session reorders it (a session kept on a fallback would keep a
        paid key before the free one it stands in for). A route that cannot be used is passed
        over when it is taken (`acquire`).
        """
        candidates = list(res.candidates)
        if pinned is not None and all(c.route != pinned for c in candidates):
            pair = self.cfg.split_route(pinned)
            if pair is None:
                raise InvalidPinError(f"pinned route {pinned!r} is not a route of "
                                      f"{res.model!r}")
            candidates.append(provider_candidate(*pair))
        if needs:
            pin = next((c for c in candidates if c.route == pinned), None)
            if pin is not None and not has_caps(pin, needs, mesh_serves):
                raise UnsupportedCapabilityError(pinned or res.model, needs)
            candidates = [c for c in candidates if has_caps(c, needs, mesh_serves)]
        held, verdict = self.warm(turn, now) if res.strategy != PRIORITY else (None, None)
        if held is not None and (refused := warm_refused(
                self.gates, held, candidates, tokens, now)):
            held, verdict = None, refused
        ranked = [self.score(c, res.strategy, now, rng, objective, (turn.prompt_tokens, min(
            held.tokens, turn.prompt_tokens)) if held and turn and c.route == held.route
            else None) for c in candidates]
        if res.strategy == PRIORITY:
            return Ranked(move_first(ranked, pinned))
        if objective == COST:
            ranked.sort(key=by_price)
        else:
            ranked.sort(key=by_score)
        if held is not None and turn is not None:
            kept = (ranked[0].candidate.route == held.route if objective == COST
                    else self._keeps(held, turn, candidates, res.strategy, now, objective))
            ranked = move_first(ranked, held.route) if kept else ranked
            verdict = Verdict.KEPT if kept else Verdict.WORSE
        sticky = self.sessions.get(session, now) if objective != COST else None
        if sticky is not None and not self._usable(sticky, ranked, tokens, now):
            sticky = None
        for first in (sticky, pinned):  # the pin ends up in front of the session's route
            ranked = move_first(ranked, first)
        return Ranked(ranked, verdict)

    # -- taking a route -------------------------------------------------------------------

    def acquire(self, candidate: Candidate, tokens: int, now: float, *,
                context_tokens: int | None = None,
                prefer: tuple[int, ...] = ()) -> ChainAttempt | list[PassedOver]:
        """Take the candidate: a key that passes its gates (reserved), or why none does.

        `tokens`: what to reserve against the key's limits (`TokenEstimate.reserve`);
        `context_tokens`: what the context must hold (`TokenEstimate.context_need`; default
        `tokens`); `prefer`: the keys to try, in order (affinity.py; else round-robin).
        """
        early = self.admit(candidate, tokens, context_tokens)
        if early is not None or candidate.provider is None or candidate.model is None:
            return early or ChainAttempt(candidate)
        return self.taken(candidate, *self.gates.take(candidate.provider, candidate.model,
                                                      tokens, now, prefer))

    def admit(self, candidate: Candidate, tokens: int,
              context_tokens: int | None = None) -> ChainAttempt | list[PassedOver] | None:
        """What `acquire` decides before the key gates: passed over for `context`, a mesh
        route taken; None when a provider key must be taken (`KeyGates.take`)."""
        need = tokens if context_tokens is None else context_tokens
        if candidate.context is not None and need > candidate.context:
            return [PassedOver(candidate.route, "context")]
        if candidate.provider is None or candidate.model is None:
            return ChainAttempt(candidate)
        return None

    @staticmethod
    def taken(candidate: Candidate, reservation: Reservation | None,
              refused: list[tuple[int, Refusal]]) -> ChainAttempt | list[PassedOver]:
        """The attempt of a key the gates took, or why each key was refused."""
        if reservation is None:
            return [PassedOver(key_route(candidate.route, k), r.reason, r.until)
                    for k, r in refused]
        return ChainAttempt(candidate, reservation.key, reservation)

    def record(self, attempt: ChainAttempt, kind: OutcomeKind, now: float, *,
               reason: str | None = None, used_tokens: int | None = None,
               tokens_per_s: float | None = None, ttfb_ms: float | None = None,
               retry_after_s: float | None = None, session: str | None = None,
               turn: Turn | None = None, prompt_tokens: int | None = None,
               cached_tokens: int = 0) -> PassedOver | None:
        """Fold an attempt's outcome in; the PassedOver to report when the route failed.

        `reason` (`http_5xx`, `timeout`, `connect`, or `context` for an upstream's
        context-length refusal, which counts as a client error) names a failure; a 429 is
        `http_429` by itself. `used_tokens` is `usage.total_tokens` when the upstream said;
        `prompt_tokens` and `cached_tokens` its prompt's (else the turn's estimate) and the
        part it read from its cache: what a cache hit saves is learned from them.
        """
        route = attempt.route
        stats = self.stats.setdefault(attempt.candidate.route, RouteStats())
        stats.record(kind, now, tokens_per_s, ttfb_ms)
        if kind is not OutcomeKind.CLIENT_ERROR:
            self._stats_dirty.add(attempt.candidate.route)
        until: float | None = None
        if attempt.reservation is not None:
            spent = used_tokens if used_tokens is not None or kind is OutcomeKind.SUCCESS else 0
            self.gates.settle(attempt.reservation, spent, now)
        if attempt.key is not None:
            if kind is OutcomeKind.RATE_LIMITED:
                until = self.gates.rate_limited(attempt.candidate.route, attempt.key,
                                                retry_after_s, now)
            elif kind is OutcomeKind.SUCCESS:
                self.gates.succeeded(attempt.candidate.route, attempt.key)
                if ttfb_ms is not None:
                    self.first_bytes.add(attempt.candidate.route, prompt_tokens or (
                        turn.prompt_tokens if turn else 0), cached_tokens, ttfb_ms)
                c, p = attempt.candidate, attempt.candidate.provider
                keys, ttl = (len(p.keys), p.cache_ttl_s) if p else (0, 0.0)
                self.affinity.served(turn, c.route, attempt.key, now, ttl, bool(
                    turn and keys and self.moved(turn, c.route, attempt.key, keys)))
        if kind is OutcomeKind.SUCCESS:
            self.sessions.served(session, attempt.candidate.route, now)
            return None
        if kind is OutcomeKind.RATE_LIMITED:
            return PassedOver(route, "http_429", until)
        if kind is OutcomeKind.CLIENT_ERROR and reason is None:
            return None
        return PassedOver(route, reason or "http_5xx")

    def key_refused(self, attempt: ChainAttempt, status: int, now: float) -> PassedOver:
        """A 401 or 403 for the attempt's key: the key leaves rotation (`KeyGates.revoke`),
        nothing of the reservation counts as spent, and the route's statistics are untouched
        (the key is at fault, not the route). The PassedOver to report; acquiring the same
        candidate again gives its next key."""
        c = attempt.candidate
        if c.provider is None or c.model is None or attempt.key is None:
            raise ValueError("only a provider key can be refused")
        if attempt.reservation is not None:
            self.gates.settle(attempt.reservation, 0, now)
        self.gates.revoke(c.provider.name, c.model.id, attempt.key, status, now)
        return PassedOver(attempt.route, attempt_reason(status))

    def exhausted(self, res: Resolution, passed: list[PassedOver], now: float) -> Exhaustion:
        return exhaustion(res, passed, now)

    def may_attempt(self, attempts: int, started: float, now: float) -> bool:
        """Whether the loop may try one more route: under `max_attempts` and the time budget."""
        routing = self.cfg.routing
        return attempts < routing.max_attempts and now - started < routing.total_budget_s

    def time_left(self, started: float, now: float) -> float:
        """Seconds of the request's total budget still left (for the next attempt's timeout)."""
        return max(0.0, self.cfg.routing.total_budget_s - (now - started))

    def wait_for_key(self, passed: Sequence[PassedOver], started: float,
                     now: float) -> float | None:
        """Seconds to wait for the soonest reset, when `wait_for_key_s` allows it; else None.

        The adapter sleeps this long and then runs the loop once more; the wait must also fit
        in the request's remaining time budget.
        """
        limit = self.cfg.routing.wait_for_key_s
        soonest = soonest_reset(passed, now)
        if limit <= 0 or soonest is None:
            return None
        wait = soonest - now
        return wait if wait <= limit and wait < self.time_left(started, now) else None

    # -- operators ------------------------------------------------------------------------

    def clear(self, route: str | None = None, now: float | None = None) -> int:
        """Clear cooldowns, revoked keys and 429 penalties: all, one route (`fastco/big-model`)
        or one key (`fastco/big-model#2`, its cooldown and revocation only). How many keys had
        a cooldown or were revoked."""
        base, key = split_key_route(route)
        if key is None:
            for name, stats in self.stats.items():
                if base is None or name == base:
                    stats.clear_penalty()
                    self._stats_dirty.add(name)
        return self.gates.clear(base, key, now)

    def knows_route(self, route: str) -> bool:
        """Whether `clear` can name `route`: a provider route (or one of its keys) or a mesh
        model with statistics."""
        base, key = split_key_route(route)
        assert base is not None
        pair = self.cfg.split_route(base)
        if pair is not None:
            return key is None or 1 <= key <= len(pair[0].keys)
        return key is None and base in self.stats

    def chain_view(self, res: Resolution, now: float,
                   objective: Objective = DEFAULT_OBJECTIVE) -> dict[str, Any]:
        """`GET /v1/routing/chain`: the order a request (with `objective`) would try now
        (ranked.chain_view)."""
        return chain_view(res, self.rank(res, now, objective=objective), self.gates, now,
                          objective)

    # -- persistence ----------------------------------------------------------------------

    def snapshot(self, now: float, *, changed_only: bool = False) -> Snapshot:
        """Plain rows for the state store; `changed_only`: those changed since the last call."""
        data = self.gates.snapshot(now, changed_only=changed_only)
        dirty, self._stats_dirty = self._stats_dirty, set()
        data["stats"] = [{"name": name, "key": 0, **s.to_dict()}
                         for name, s in self.stats.items() if not changed_only or name in dirty]
        return data

    def restore(self, data: Snapshot) -> None:
        """Load rows from the state store; a malformed row raises StateRestoreError."""
        try:
            self.gates.restore(data)
            for row in data.get("stats", []):
                self.stats[str(row["name"])] = RouteStats.from_dict(row)
        except (KeyError, TypeError, ValueError) as exc:
            raise StateRestoreError(f"malformed provider state row ({exc!r})") from exc

    # -- internals ------------------------------------------------------------------------

    def _headroom(self, candidate: Candidate, now: float) -> float:
        """The best key's headroom: the route stays attractive while one key has budget left."""
        provider, model = candidate.provider, candidate.model
        if provider is None or model is None or model.monthly_tokens is None:
            return 1.0
        least = min(self.gates.month_tokens(candidate.route, k, now)
                    for k in range(1, len(provider.keys) + 1))
        return headroom_factor(least, model.monthly_tokens)  # falls as usage rises

    def _keeps(self, held: Held, turn: Turn, candidates: list[Candidate], strategy: str,
               now: float, objective: Objective) -> bool:
        """Whether the warm route's expected score, with its cache's saving in first-byte time
        (learned) and price priced in, is at least every other route's (affinity.keeps)."""
        warm = (turn.prompt_tokens, min(held.tokens, turn.prompt_tokens))
        scores = {c.route: self.score(c, strategy, now, None, objective, warm if c.route ==
                                      held.route else (turn.prompt_tokens, 0)).score
                  for c in candidates}
        own = scores.pop(held.route, None)
        return keeps(own, max((v for v in scores.values() if v is not None), default=None))

    def _usable(self, route: str, ranked: list[Scored], tokens: int, now: float) -> bool:
        """A session's route is usable while it is a candidate and one of its keys passes."""
        c = next((s.candidate for s in ranked if s.candidate.route == route), None)
        if c is None:
            return False
        if c.context is not None and tokens > c.context:
            return False
        if c.provider is None or c.model is None:
            return True
        return any(self.gates.check(c.provider, c.model, k, tokens, now) is None
                   for k in range(1, len(c.provider.keys) + 1))

