"""The Router facade that every adapter uses: topology in, decisions out, outcomes back."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from .cache_prior import prior_warm_tokens, route_prior
from .capabilities import NO_NEEDS, UnsupportedCapabilityError
from .config import RouterConfig
from .decision import Decision as Decision  # re-exported: its importers by the old path
from .decision import slot_free, uncached
from .errors import ModelGoneError, NoRouteError, UnknownModelError
from .kinds import (
    FAILURE,
    FALLBACK,
    PINNED,
    SAMPLE,
    SUCCESS,
    ChangeKind,
    RecordResult,
)
from .node_load import RECORD_LAG_S, NodeLoads
from .objectives import DEFAULT_OBJECTIVE, TTFT, Objective
from .policies import Arm, Outcome, Policy
from .policies.registry import make_policy
from .policies.ttft import ttft_choice
from .prefix import Prefix, PrefixTable
from .routes import Route, enumerate_routes, pinned_route
from .routing_table import RECENT_ATTEMPTS, routing_table
from .stats import RouteStatsStore
from .topology import ModelTopology, NodeRecord, Topology, parse_networks

Clock = Callable[[], float]


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
                                    uncached_tokens=uncached(prefix, chosen.warm_tokens),
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
                                    prefix=prefix, uncached_tokens=uncached(prefix, warm),
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

    def own_in_flight(self) -> dict[str, int]:
        """This tracker's own attempts open now, by route signature (no other tracker's)."""
        return dict(self._in_flight)

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
                                       slot_free=slot_free(decision))
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
    def routing_table(self, model: str | None = None) -> dict[str, Any]:
        """The /v1/routing document: config and, per model, epoch and candidate table."""
        return routing_table(self, model)

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
