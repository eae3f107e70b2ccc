"""A discrete-event mesh simulator that drives the real Router on a simulated clock.

Every request is decided by `Router.choose`, occupies one slot on every node of its route for
its whole service time (waiting in FIFO order while any of them is full), and is reported back
with `Router.record`; joins and leaves go through `upsert_node` / `remove_node`. All workload
randomness (token counts, noise, failures, arrival gaps) is drawn up front from the seed, so
every policy faces the very same requests.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field, replace

from ..core.config import RouterConfig
from ..core.errors import MeshRouteError
from ..core.policies import Outcome
from ..core.router import Decision, Router
from ..core.routes import Route
from .model import MODEL, Event, NodeSpec, Scenario
from .oracle import GOOD_WITHIN, OraclePolicy

ARRIVE, FINISH, ANNOUNCE = 0, 1, 2


@dataclass(slots=True)
class NodeState:
    """A node's live state: its spec (speed may drift), slots in use and queue."""

    spec: NodeSpec
    present: bool = True
    busy: int = 0  # slots in use
    queued: int = 0  # waiting requests that need this node
    load_s: float = 0.0  # expected service seconds of its running and queued requests


@dataclass(slots=True)
class Request:
    """One simulated request; the random draws are fixed before any policy sees it."""

    index: int
    tokens: int
    noise: float  # multiplicative service-time noise
    fail_u: float
    cut_u: float
    gap_s: float  # to the next arrival (open loop)
    arrival_s: float = 0.0
    decision: Decision | None = None
    nodes: tuple[str, ...] = ()
    service_s: float = 0.0  # expected, at dispatch
    fail_p: float = 0.0
    good: bool = False  # within GOOD_WITHIN of the oracle's choice when decided


@dataclass(slots=True)
class Trace:
    """What one run produced, per request in arrival order."""

    arrival_s: list[float] = field(default_factory=list)
    finish_s: list[float] = field(default_factory=list)
    tokens_ok: list[int] = field(default_factory=list)
    failed: list[bool] = field(default_factory=list)
    good: list[bool] = field(default_factory=list)


class Simulator:
    """One scenario run with one policy and one seed."""

    def __init__(self, scenario: Scenario, policy: str, seed: int) -> None:
        self.scenario = scenario
        self.seed = seed
        self.now = 0.0
        self.nodes: dict[str, NodeState] = {}
        oracle = OraclePolicy(self) if policy == "oracle" else None
        self.router = Router(RouterConfig() if oracle else RouterConfig(policy=policy),
                             clock=lambda: self.now, rng=random.Random(seed * 7919 + 17),
                             policy=oracle)
        self.requests = _draw_requests(scenario, random.Random(seed))
        self._events = sorted(scenario.events, key=lambda e: e.at_request)
        self._heap: list[tuple[float, int, int, Request | None]] = []
        self._seq = 0
        self._waiting: list[Request] = []
        self._next = 0
        self.current: Request | None = None  # the request being decided
        self.done: dict[int, tuple[float, int, bool]] = {}
        for spec in scenario.nodes:
            self._join(spec)

    # -- ground truth ---------------------------------------------------------------
    def route_truth(self, route: Route) -> tuple[float, float, float]:
        """(seconds per token, latency seconds, failure probability) of a route right now."""
        per_token = (len(route.hops) - 1) * self.scenario.hop_token_s
        latency, ok_p = 0.0, 1.0
        for hop in route.hops:
            spec = self.nodes[hop.node.node_id].spec
            per_token += (hop.end_layer - hop.start_layer + 1) * spec.s_per_layer
            latency += spec.latency_s
            ok_p *= 1.0 - spec.fail_rate
        return per_token, latency, 1.0 - ok_p

    def expected_wait_s(self, node_id: str) -> float:
        """The oracle's estimate of how long a new request waits for a slot on a node."""
        n = self.nodes[node_id]
        ahead = n.busy + n.queued
        if ahead < n.spec.slots:
            return 0.0
        return (ahead + 1 - n.spec.slots) / n.spec.slots * (n.load_s / ahead)

    def expected_cost_s(self, route: Route, tokens: int) -> float:
        """Expected seconds of mesh time per delivered request (failures retried in kind)."""
        per_token, latency, fail_p = self.route_truth(route)
        wait = max(self.expected_wait_s(h.node.node_id) for h in route.hops)
        service = tokens * per_token + latency
        # A failure is cut at a uniform point of the service, so it costs half on average.
        return (wait + service * (1.0 - fail_p / 2)) / max(1.0 - fail_p, 1e-9)

    # -- the run ----------------------------------------------------------------------
    def run(self) -> Trace:
        """Simulate every request to completion and return the trace."""
        if self.scenario.poisson_rate > 0:
            t = 0.0
            for r in self.requests:
                r.arrival_s = t
                self._push(t, ARRIVE, r)
                t += r.gap_s
        else:
            for _ in range(min(self.scenario.clients, len(self.requests))):
                self._push(0.0, ARRIVE, None)
        if self.scenario.announce_s > 0:
            self._push(self.scenario.announce_s, ANNOUNCE, None)
        while self._heap:
            t, _, kind, req = heapq.heappop(self._heap)
            self.now = t
            if kind == ARRIVE:
                self._arrive(req)
            elif kind == FINISH:
                assert req is not None
                self._finish(req)
            else:
                self._announce()
        return self._trace()

    def _push(self, t: float, kind: int, req: Request | None) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, req))

    def _arrive(self, req: Request | None) -> None:
        if req is None:  # closed loop: the next request of the sequence
            if self._next >= len(self.requests):
                return
            req = self.requests[self._next]
            req.arrival_s = self.now
        self._next = max(self._next, req.index + 1)
        while self._events and self._events[0].at_request <= req.index:
            self._apply(self._events.pop(0))
        self.current = req
        try:
            decision = self.router.choose(MODEL)
        except MeshRouteError:
            self._end(req, ok=False)
            return
        self._dispatch(req, decision)

    def _dispatch(self, req: Request, decision: Decision) -> None:
        route = decision.route
        costs = [self.expected_cost_s(r, req.tokens) for r in self.router.candidates(MODEL)]
        chosen = self.expected_cost_s(route, req.tokens)
        req.good = chosen <= min(costs) * (1.0 + GOOD_WITHIN)
        per_token, latency, req.fail_p = self.route_truth(route)
        req.decision, req.nodes = decision, route.node_ids
        req.service_s = req.tokens * per_token + latency
        for node_id in req.nodes:
            node = self.nodes[node_id]
            node.queued += 1
            node.load_s += req.service_s
        self._waiting.append(req)
        self._start_waiting()

    def _start_waiting(self) -> None:
        """Start waiting requests in FIFO order per node (a blocked node blocks later ones)."""
        blocked: set[str] = set()
        still: list[Request] = []
        for req in self._waiting:
            nodes = [self.nodes[n] for n in req.nodes]
            if blocked.isdisjoint(req.nodes) and all(n.busy < n.spec.slots for n in nodes):
                self._start(req, nodes)
            else:
                blocked.update(req.nodes)
                still.append(req)
        self._waiting = still

    def _start(self, req: Request, nodes: list[NodeState]) -> None:
        for node in nodes:
            node.queued -= 1
            node.busy += 1
        seconds = req.service_s * req.noise
        if req.fail_u < req.fail_p:
            seconds *= req.cut_u
        self._push(self.now + seconds, FINISH, req)

    def _finish(self, req: Request) -> None:
        for node_id in req.nodes:
            node = self.nodes[node_id]
            node.busy -= 1
            node.load_s -= req.service_s
        ok = req.fail_u >= req.fail_p
        self._end(req, ok=ok)
        self._start_waiting()

    def _end(self, req: Request, *, ok: bool, error: str = "stream") -> None:
        """Report the outcome to the router and log it; a closed-loop client sends again."""
        seconds = self.now - req.arrival_s
        if req.decision is not None:
            per_token = req.service_s / max(req.tokens, 1)
            ttfb = min(seconds, per_token * req.noise)
            outcome = (Outcome(req.tokens, seconds, ttfb) if ok
                       else Outcome(0, seconds, 0.0, error))
            self.router.record(req.decision, outcome)
        self.done[req.index] = (self.now, req.tokens if ok else 0, not ok)
        if self.scenario.poisson_rate <= 0:
            self._push(self.now, ARRIVE, None)

    # -- topology -----------------------------------------------------------------------
    def _announce(self) -> None:
        """Every node re-announces its record with its current queue depth (a refresh)."""
        if len(self.done) == len(self.requests):
            return  # the run is over
        for state in self.nodes.values():
            if state.present:
                record = state.spec.record(self._advertised(state.spec))
                self.router.upsert_node(replace(record, queue=state.queued))
        self._push(self.now + self.scenario.announce_s, ANNOUNCE, None)

    def _join(self, spec: NodeSpec) -> None:
        state = self.nodes.get(spec.node_id)
        if state is None:
            self.nodes[spec.node_id] = NodeState(spec)
        else:
            state.spec, state.present = spec, True
        self.router.upsert_node(spec.record(self._advertised(spec)))

    def _advertised(self, spec: NodeSpec) -> float:
        """What a node announces: its stated figure, else one noisy benchmark of its shard
        (a single draw of the scenario's noise, fixed per seed and node)."""
        if spec.advertised_tps is not None:
            return spec.advertised_tps
        sigma = self.scenario.noise_sigma
        z = random.Random(f"{self.seed}:{spec.node_id}").gauss(0.0, 1.0)
        return spec.shard_tps * math.exp(sigma * z - sigma * sigma / 2)

    def _apply(self, event: Event) -> None:
        if event.kind == "join" and event.node is not None:
            self._join(event.node)
        elif event.kind == "leave":
            self._leave(event.node_id)
        elif event.kind == "slow":
            state = self.nodes[event.node_id]
            spec = state.spec
            state.spec = NodeSpec(spec.node_id, spec.start, spec.end, spec.layers,
                                  spec.s_per_layer * event.factor, spec.slots, spec.latency_s,
                                  spec.fail_rate, spec.advertised_tps)

    def _leave(self, node_id: str) -> None:
        """A node leaves: running requests drain, waiting ones fail to connect."""
        self.nodes[node_id].present = False
        self.router.remove_node(node_id)
        stranded = [r for r in self._waiting if node_id in r.nodes]
        self._waiting = [r for r in self._waiting if node_id not in r.nodes]
        for req in stranded:
            for n in req.nodes:
                self.nodes[n].queued -= 1
                self.nodes[n].load_s -= req.service_s
            self._end(req, ok=False, error="connect")
        self._start_waiting()

    def _trace(self) -> Trace:
        trace = Trace()
        for req in self.requests:
            finish, tokens, failed = self.done[req.index]
            trace.arrival_s.append(req.arrival_s)
            trace.finish_s.append(finish)
            trace.tokens_ok.append(tokens)
            trace.failed.append(failed)
            trace.good.append(req.good)
        return trace


def _draw_requests(scenario: Scenario, rng: random.Random) -> list[Request]:
    """The workload: token counts, mean-one log-normal noise, failure draws."""
    sigma = scenario.noise_sigma
    lo, hi = scenario.tokens
    rate = scenario.poisson_rate
    out = []
    for i in range(scenario.requests):
        noise = math.exp(rng.gauss(0.0, sigma) - sigma * sigma / 2)
        gap_s = rng.expovariate(rate) if rate > 0 else 0.0
        out.append(Request(i, rng.randint(lo, hi), noise, rng.random(), rng.random(), gap_s))
    return out


def run(scenario: Scenario, policy: str, seed: int) -> Trace:
    """Run one scenario with one policy (a registered name, or "oracle") and seed."""
    return Simulator(scenario, policy, seed).run()
