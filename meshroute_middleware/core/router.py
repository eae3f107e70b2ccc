"""The Router facade that every adapter uses: topology in, decisions out, outcomes back."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from .cache_prior import prior_warm_tokens, route_prior
from .capabilities import CAPABILITIES, NO_NEEDS, UnsupportedCapabilityError
from .config import RouterConfig
from .errors import ModelGoneError, NoRouteError, UnknownModelError
from .kinds import (
    FAILURE,
    FALLBACK,
    PINNED,
    SAMPLE,
    SUCCESS,
    ChangeKind,
    DecisionMode,
    RecordResult,
)
from .node_load import RECORD_LAG_S, NodeLoads
from .objectives import DEFAULT_OBJECTIVE, TTFT, Objective
from .policies import Arm, Outcome, Policy
from .policies.registry import make_policy
from .policies.ttft import ttft_choice, ttft_rank
from .prefix import Prefix, PrefixTable
from .routes import Route, enumerate_routes, pinned_route
from .stats import RouteStatsStore, RouteView
from .topology import ModelTopology, NodeRecord, Topology, parse_networks

Clock = Callable[[], float]
ShareBasis = Literal["policy", "recent", "sampled"]  # how /v1/routing's shares were computed
RECENT_ATTEMPTS = 256  # attempts per model behind the 'recent' traffic shares
# ... the newest weighted most: an attempt counts half after this many newer ones, so the
# shown split follows a change within a few dozen attempts, not 256.
RECENT_HALF_LIFE = 32
_RECENT_WEIGHTS = [0.5 ** (age / RECENT_HALF_LIFE) for age in range(RECENT_ATTEMPTS)]
MIN_RECENT_FOR_SHARES = 32
SHARE_DRAWS = 400  # Monte-Carlo draws behind one model's 'sampled' shares
TABLE_SHARE_DRAWS = 4000  # draws for a whole table, split over its models (issue 11)
MIN_SHARE_DRAWS = 10


@dataclass(slots=True)
class Decision:
    """One routing decision: which route serves a request, and why."""

    model: str
    route: Route
    mode: DecisionMode
    attempt: int = 0  # 0 for the first choice, k for the k-th fallback
    _ranked: tuple[Route, ...] = field(default=(), repr=False)  # the fallback chain so far
    _unranked: Sequence[Arm] = field(default=(), repr=False)  # arms still to rank into it
    _open: bool = field(default=False, repr=False)  # counted in flight, not yet ended
    _load0: tuple[float, float] = field(default=(0.0, 0.0), repr=False)  # (area, t) at start
    max_tokens: int | None = None  # the request's bound on its answer, if it set one
    prefix: Prefix | None = None  # the prompt's message chain, if the request carried one
    uncached_tokens: int = -1  # of the prompt, on this route as far as the router knows
    objective: Objective = DEFAULT_OBJECTIVE  # what the request asked to be best at
    ahead: int = -1  # attempts in flight on the route when this one began

    @property
    def signature(self) -> str:
        """The chosen route's signature."""
        return self.route.signature

    @property
    def ranked(self) -> tuple[Route, ...]:
        """The fallback chain, best first.

        Ranked on first use: ranking reads every arm's merged view, which a decision that
        succeeds never needs (docs/benchmarks/engine.md).
        """
        if self._unranked:
            rank = ttft_rank if self.objective == TTFT else _fallback_rank
            self._ranked = tuple(a.route for a in sorted(self._unranked, key=rank))
            self._unranked = ()
        return self._ranked


class Router:
    """Pure routing facade: no I/O; the clock and rng are injected."""

    def __init__(self, config: RouterConfig | None = None, *, clock: Clock,
                 rng: random.Random | None = None, origin: str = "local",
                 policy: Policy | None = None, topology: Topology | None = None) -> None:
        self.config = config or RouterConfig()
        self.clock = clock
        self.rng = rng or random.Random(0)
        # `topology`: another Router's, shared: a router for another kind of request
        # (embeddings) routes over the same nodes with statistics and a policy of its own
        self.topology = topology or Topology(parse_networks(self.config.node_networks))
        self.stats = RouteStatsStore(origin, self.config.half_life_s, self.config.prune_after_s)
        self.policy = policy or make_policy(self.config)
        self._cache: dict[str, tuple[int, tuple[Route, ...]]] = {}
        # (model, needs) -> the candidates over the nodes having `needs`, per topology version
        self._needs_cache: dict[tuple[str, frozenset[str]], tuple[int, tuple[Route, ...]]] = {}
        self._in_flight: dict[str, int] = {}
        # sig -> (∫ load dt, as of t, the load since t): own in flight plus the others'
        # requests its nodes reported (several trackers, issue 31)
        self._load: dict[str, tuple[float, float, int]] = {}
        self._flying_nodes: dict[str, tuple[str, ...]] = {}  # sig in flight -> its nodes
        self.loads = NodeLoads()  # the nodes' reported load beyond our own requests
        self._recent: dict[str, deque[str]] = {}  # model -> signatures of recent attempts
        self.prefixes = PrefixTable()  # which routes served which prompt prefixes

    # -- topology -----------------------------------------------------------------
    def upsert_node(self, record: NodeRecord) -> ChangeKind:
        """Join or refresh a node; return 'join', 'shard-change' or 'refresh'. A record
        carrying its engine's load (`held`) reports it as `note_load` does, as of up to
        RECORD_LAG_S ago; the topology keeps the record without it (a load change is not
        a topology change)."""
        held = record.held
        if held is None:
            return self.topology.upsert(record, self.clock())
        change = self.topology.upsert(replace(record, held=None), self.clock())
        self.note_load(record.node_id, held, RECORD_LAG_S)
        return change

    def remove_node(self, node_id: str) -> bool:
        """A node left; return whether it was known. A model left empty is forgotten here too."""
        known = self.topology.node(node_id)
        removed = self.topology.remove(node_id, self.clock())
        if known is not None and self.topology.model(known.model) is None:
            self._cache.pop(known.model, None)
            self._recent.pop(known.model, None)
            for key in [k for k in self._needs_cache if k[0] == known.model]:
                del self._needs_cache[key]
        return removed

    def models(self) -> list[str]:
        """Models with at least one node."""
        return self.topology.models()

    def candidates(self, model: str, needs: frozenset[str] = NO_NEEDS) -> tuple[Route, ...]:
        """The enumerated candidates of a model (with `needs`: over the nodes that have those
        capabilities), cached per topology version."""
        topo = self.topology.model(model)
        if topo is None or not topo.nodes:
            return ()
        return self._candidates(model, topo, needs)

    def serves(self, model: str, needs: frozenset[str]) -> bool:
        """Whether some route of `model` has every capability in `needs`."""
        return bool(self.candidates(model, needs))

    def _candidates(self, model: str, topo: ModelTopology,
                    needs: frozenset[str] = NO_NEEDS) -> tuple[Route, ...]:
        if needs:
            return self._candidates_with(model, topo, needs)
        cached = self._cache.get(model)
        if cached is not None and cached[0] == topo.version:
            return cached[1]
        routes = enumerate_routes(model, list(topo.nodes.values()), self.config.max_candidates)
        self._cache[model] = (topo.version, routes)
        return routes

    def _candidates_with(self, model: str, topo: ModelTopology,
                         needs: frozenset[str]) -> tuple[Route, ...]:
        """Routes whose every hop has `needs`: enumerated over those nodes alone, since the
        greedy completion of all nodes may pick a hop without them where one with them exists."""
        key = (model, needs)
        cached = self._needs_cache.get(key)
        if cached is not None and cached[0] == topo.version:
            return cached[1]
        routes = enumerate_routes(model, list(topo.nodes.values()), self.config.max_candidates,
                                  needs)
        self._needs_cache[key] = (topo.version, routes)
        return routes

    def _changed_at(self, model: str) -> float:
        topo = self.topology.model(model)
        return float("-inf") if topo is None else topo.changed_at

    # -- decisions ----------------------------------------------------------------
    def arms(self, model: str, now: float | None = None) -> list[Arm]:
        """The candidates of a model with their merged statistics."""
        topo = self.topology.model(model)
        if topo is None or not topo.nodes:
            return []
        return self._arms(model, topo, self.clock() if now is None else now)

    def _arms(self, model: str, topo: ModelTopology, now: float,
              max_tokens: int | None = None, needs: frozenset[str] = NO_NEEDS) -> list[Arm]:
        routes = self._candidates(model, topo, needs)
        merged = self.stats.merged_many(model, [r.signature for r in routes], topo.changed_at)
        flying = self._in_flight
        if self.loads.others:  # nodes reported requests other trackers sent
            others = self.loads.others_on
            return [Arm(r, None, flying.get(r.signature, 0) + others(r.node_ids, now), m, now,
                        max_tokens) for r, m in zip(routes, merged, strict=True)]
        return [Arm(r, None, flying.get(r.signature, 0), m, now, max_tokens)
                for r, m in zip(routes, merged, strict=True)]

    def choose(self, model: str, pin: Sequence[str] | None = None,
               max_tokens: int | None = None, prefix: Prefix | None = None,
               needs: frozenset[str] = NO_NEEDS, *,
               objective: Objective = DEFAULT_OBJECTIVE) -> Decision:
        """Pick the route for one request (`max_tokens`: the request's bound on its answer,
        if it sets one; `prefix`: its prompt's message chain, which recognises a returning
        conversation; `needs`: the capabilities it needs, which only routes having them are
        candidates for; `objective`: `ttft` takes the least expected time to first token
        (policies/ttft.py), `throughput` and `cost` the policy's choice, every mesh route
        being free); raise UnknownModelError / InvalidPinError / NoRouteError /
        UnsupportedCapabilityError. The decision counts as in flight until `record`."""
        topo = self.topology.model(model)
        if topo is None or not topo.nodes:
            if self.topology.departed(model) is not None:  # known, gone for now: 503
                raise ModelGoneError(f"no node serves model {model!r} now: its last node left "
                                     "(it is routed again as soon as a node serves it)")
            raise UnknownModelError(f"no node serves model {model!r}")
        if pin is not None:
            route = pinned_route(model, pin, topo.nodes)
            if not needs <= route.caps:
                raise UnsupportedCapabilityError(model, needs - route.caps)
            return self._begin(Decision(model, route, PINNED, objective=objective))
        now = self.clock()
        arms = self._arms(model, topo, now, max_tokens, needs)
        if not arms:
            if needs and self._candidates(model, topo):
                raise UnsupportedCapabilityError(model, self._missing(model, topo, needs))
            raise NoRouteError(f"no route covers every layer of {model!r}",
                               self.gaps(model))
        if prefix is not None:
            warm = self.prefixes.warm(prefix)
            for arm in arms:
                arm.prefix, arm.warm_tokens = prefix, warm.get(arm.signature, 0)
                if arm.warm_tokens:
                    arm.warm_tokens = _with_server_prior(arm)
        if objective == TTFT:
            i, mode = ttft_choice(arms, self.rng, getattr(self.policy, "expected_ttft", None))
        else:
            i, mode = self.policy.choose(arms, now, self.rng)
        chosen = arms.pop(i)
        return self._begin(Decision(model, chosen.route, mode, 0, (), arms,
                                    max_tokens=max_tokens, prefix=prefix,
                                    uncached_tokens=_uncached(prefix, chosen.warm_tokens),
                                    objective=objective))

    def _missing(self, model: str, topo: ModelTopology,
                 needs: frozenset[str]) -> frozenset[str]:
        """Which of `needs` no route has (all of them when only their combination is missing)."""
        missing = frozenset(c for c in needs if not self._candidates(model, topo, frozenset({c})))
        return missing or needs

    def fallback(self, decision: Decision) -> Decision | None:
        """The next ranked route after a failed attempt, or None when all are spent."""
        if not decision.ranked:
            return None
        route, rest = decision.ranked[0], decision.ranked[1:]
        prefix = decision.prefix
        warm = self.prefixes.warm(prefix).get(route.signature, 0) if prefix else 0
        return self._begin(Decision(decision.model, route, FALLBACK,
                                    decision.attempt + 1, rest, max_tokens=decision.max_tokens,
                                    prefix=prefix, uncached_tokens=_uncached(prefix, warm),
                                    objective=decision.objective))

    def _begin(self, decision: Decision) -> Decision:
        sig = decision.signature
        now = self.clock()
        decision._load0 = (self._tick(sig, now), now)
        own = self._in_flight.get(sig, 0)
        nodes = decision.route.node_ids
        decision.ahead = own + (self.loads.others_on(nodes, now) if self.loads.others else 0)
        self._in_flight[sig] = own + 1
        self._flying_nodes[sig] = nodes
        self.loads.begin(nodes)
        self._tick(sig, now)  # the load from now on counts this attempt
        recent = self._recent.get(decision.model)
        if recent is None:
            recent = self._recent[decision.model] = deque(maxlen=RECENT_ATTEMPTS)
        recent.append(sig)
        decision._open = True
        return decision

    def _tick(self, sig: str, now: float) -> float:
        """The route's load (own in flight plus the others' its nodes reported) integrated
        over time up to `now`; the load from `now` on is read afresh."""
        area, t, load = self._load.get(sig, (0.0, now, 0))
        area += load * max(now - t, 0.0)
        load = self._in_flight.get(sig, 0)
        if load and self.loads.others:
            load += self.loads.others_on(self._flying_nodes.get(sig, ()), now)
        self._load[sig] = (area, now, load)
        return area

    def note_load(self, node_id: str, held: int, lag_s: float = 0.0) -> None:
        """A node says it holds `held` requests, running and queued, every tracker's (its
        answer's `x-meshroute-load` header, now; its record's `held`, up to `lag_s` old):
        the others' requests beside ours count in every route through it until the next
        report (core/node_load.py)."""
        now = self.clock()
        touched = [sig for sig, nodes in self._flying_nodes.items() if node_id in nodes]
        for sig in touched:  # close the load integral at the old count
            self._tick(sig, now)
        self.loads.report(node_id, held, now, lag_s)
        for sig in touched:
            self._tick(sig, now)

    def concurrency(self, decision: Decision, now: float) -> float:
        """The route's mean in-flight count over an open attempt's life so far."""
        area0, t0 = decision._load0
        area = self._tick(decision.signature, now)
        if now > t0:
            return (area - area0) / (now - t0)
        return float(self._load[decision.signature][2])

    def cancel(self, decision: Decision) -> None:
        """End an attempt that says nothing about the route (the client's own 4xx, or it
        went away before any byte): no sample, no failure. Ending twice counts once."""
        if not decision._open:
            return
        decision._open = False
        sig = decision.signature
        now = self.clock()
        self._tick(sig, now)
        self.loads.end(decision.route.node_ids, now)
        left = self._in_flight.get(sig, 0) - 1
        if left > 0:
            self._in_flight[sig] = left
            self._tick(sig, now)
        else:
            self._in_flight.pop(sig, None)
            self._flying_nodes.pop(sig, None)
            self._load.pop(sig, None)  # no attempt open on it: nothing refers to its area

    def record(self, decision: Decision, outcome: Outcome) -> RecordResult:
        """Record a finished attempt; return 'sample', 'success' (too few tokens to be a
        sample) or 'failure'."""
        sig, model, now = decision.signature, decision.model, self.clock()
        if decision._open:
            outcome = outcome._replace(concurrency=self.concurrency(decision, now),
                                       max_tokens=decision.max_tokens,
                                       uncached_tokens=decision.uncached_tokens,
                                       ahead=decision.ahead,
                                       slot_free=_slot_free(decision))
            if decision.prefix is not None and outcome.ok:
                self.prefixes.served(decision.prefix, sig)
        self.cancel(decision)
        changed_at = self._changed_at(model)
        self.policy.observe(sig, outcome, now)
        if not outcome.ok:
            self.stats.record_failure(model, sig, outcome.error, now, changed_at)
            return FAILURE
        tps = outcome.tps
        if outcome.completion_tokens < self.config.min_sample_tokens or tps is None:
            self.stats.record_success(model, sig, now, changed_at)
            return SUCCESS
        seconds = outcome.seconds
        ttfb_s = outcome.ttfb_s if 0 <= outcome.ttfb_s <= seconds else seconds
        summary = getattr(self.policy, "curve_summary", None)  # shared through gossip
        curve = summary(sig) if summary is not None else None
        self.stats.record_sample(model, sig, tps, ttfb_s, now, changed_at, curve)
        return SAMPLE

    def gaps(self, model: str) -> dict[str, str]:
        """Why each head of a model cannot form a route (for 503 diagnostics)."""
        topo = self.topology.model(model)
        if topo is None:
            return {}
        heads = [n for n in topo.nodes.values() if n.start == 0]
        if not heads:
            return {"*": f"no node serves layer 0 of {model!r}"}
        return {n.node_id: "no chain of nodes from this head reaches the last layer"
                for n in heads}

    # -- visibility ---------------------------------------------------------------
    def _shares(self, arms: Sequence[Arm],
                draws: int = SHARE_DRAWS) -> tuple[list[float], ShareBasis]:
        """Shares and their basis: 'policy' (closed form), 'recent' (what the last attempts
        did: a load-aware policy's next pick depends on what is in flight, so one snapshot
        would say 100 % for whichever route is idle) or 'sampled' (Monte Carlo, cold)."""
        exact = getattr(self.policy, "shares", None)
        if exact is not None:
            return list(exact(arms)), "policy"
        recent = self._recent.get(arms[0].route.model) if arms else None
        if recent is not None and len(recent) >= MIN_RECENT_FOR_SHARES:
            weights: dict[str, float] = {}
            # newest first; the deque holds at most RECENT_ATTEMPTS
            for signature, w in zip(reversed(recent), _RECENT_WEIGHTS, strict=False):
                weights[signature] = weights.get(signature, 0.0) + w
            total = sum(weights.values())
            return [weights.get(a.signature, 0.0) / total for a in arms], "recent"
        if len(arms) == 1:
            return [1.0], "sampled"
        return estimate_shares(self.policy, arms, self.clock(), draws), "sampled"

    def routing_table(self, model: str | None = None) -> dict[str, Any]:
        """The /v1/routing document: config and, per model, epoch and candidate table."""
        models = self.models() if model is None else [model]
        now = self.clock()
        # A bounded draw budget per table: 3,000 models at 400 draws each blocked the loop
        # for seconds; a one-model table keeps the full 400.
        draws = max(MIN_SHARE_DRAWS, min(SHARE_DRAWS, TABLE_SHARE_DRAWS // max(1, len(models))))
        out: dict[str, Any] = {}
        for name in models:
            topo = self.topology.model(name)
            arms = self.arms(name, now)
            shares, basis = self._shares(arms, draws) if arms else ([], "policy")
            out[name] = {"epoch": topo.epoch if topo else 0, "share_basis": basis,
                         "candidates": self._table(arms, shares)}
        return {"config": self.config.to_dict(), "models": out}

    def _table(self, arms: Sequence[Arm], shares: Sequence[float]) -> list[dict[str, Any]]:
        best = max((a.view.tps or 0.0 for a in arms if a.proven), default=0.0)
        # The policy's own current estimate (thompson: its curve's s1), where it keeps one.
        estimate: Callable[[str], float | None] = getattr(
            self.policy, "estimate", lambda _signature: None)
        return [_row(a, best, s, estimate(a.signature))
                for a, s in zip(arms, shares, strict=True)]

    def prune(self) -> int:
        """Drop statistics unseen for the prune horizon (24 h)."""
        return self.stats.prune(self.clock())


def _with_server_prior(arm: Arm) -> int:
    """The arm's warm tokens tempered by its servers' own cache reports (cache_prior.py),
    which fade as the route's own measured samples arrive; unchanged without a report."""
    prior = route_prior(h.node.cache for h in arm.route.hops)
    if prior is None:
        return arm.warm_tokens
    return prior_warm_tokens(prior, arm.warm_tokens, arm.view.count)


def _slot_free(decision: Decision) -> bool:
    """Whether the route's announced slots were not all taken when the attempt began."""
    slots = decision.route.slots
    return slots is not None and 0 <= decision.ahead < slots


def _uncached(prefix: Prefix | None, warm_tokens: int) -> int:
    """The prompt's tokens a route is not known to hold (-1 without a prompt)."""
    return -1 if prefix is None else max(prefix.prompt_tokens - warm_tokens, 0)


def _fallback_rank(arm: Arm) -> tuple[int, float]:
    """Fallback order: proven arms by learned tps, then the rest by prior."""
    v: RouteView = arm.view
    if arm.proven and v.tps is not None:
        return (0, -v.tps)
    return (1, -arm.route.prior_tps)


def estimate_shares(policy: Policy, arms: Sequence[Arm], now: float,
                    draws: int = 400) -> list[float]:
    """Monte-Carlo traffic shares for policies without a closed form (display only)."""
    rng = random.Random(0x5EED)
    counts = [0] * len(arms)
    for _ in range(draws):
        counts[policy.choose(arms, now, rng)[0]] += 1
    return [c / draws for c in counts]


def _row(arm: Arm, best_tps: float, share: float, estimate: float | None) -> dict[str, Any]:
    v = arm.view
    return {
        "signature": arm.signature,
        "hops": [{"node_id": h.node.node_id, "start_layer": h.start_layer,
                  "end_layer": h.end_layer} for h in arm.route.hops],
        "head": arm.route.head.node_id,
        "caps": [c for c in CAPABILITIES if c in arm.route.caps],  # what every hop serves
        "tps": v.tps,
        "prior_tps": arm.prior_tps,
        "estimate_tps": estimate,
        "coefficient": (v.tps / best_tps) if (v.tps is not None and best_tps > 0) else None,
        "share": share,
        "samples": v.count,
        "weight": v.mass,
        "status": v.status,
        "ttfb_ms": None if v.ttfb_s is None else v.ttfb_s * 1000.0,
        "successes": v.ok,
        "failures": v.fail,
        "in_flight": arm.in_flight,
        "slots": arm.route.slots,  # its narrowest hop's announced batch (None: unsaid)
        "origins": v.origins,
        "last_error": v.last_error or None,
    }
