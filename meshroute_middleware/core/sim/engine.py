"""A discrete-event mesh simulator that drives the real Router on a simulated clock.

Every request is decided by `Router.choose`, occupies one slot on every node of its route from
its start to its end (waiting in FIFO order while any of them is full), and is reported back
with `Router.record`; joins and leaves go through `upsert_node` / `remove_node`. A node runs
up to `slots` requests at once and each runs slower the fuller the batch is
(`NodeSpec.slowdown`): serial servers, continuous batching and saturation are all this one
model. Speeds change whenever a batch does, so a running request's finish time is recomputed
on every start and end on its nodes. The workload is drawn up front (`workload.py`).
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass, field, replace

from ..config import RouterConfig
from ..errors import MeshRouteError
from ..kinds import ErrorKind
from ..policies import Outcome
from ..prefix import Prefix, PrefixCache
from ..router import Decision, Router
from ..routes import Route
from .model import ANSWERS, EXACT, MODEL, Event, NodeSpec, Scenario
from .oracle import FIXED_SPLIT, GOOD_WITHIN, FixedSplitPolicy, OraclePolicy, gain_score
from .workload import Request, Trace, draw_conversations, draw_requests, trace_of

ARRIVE, FINISH, ANNOUNCE, TOKENS, GOSSIP = 0, 1, 2, 3, 4


@dataclass(slots=True)
class NodeState:
    """A node's live state: its spec (speed may drift), the requests in its batch, its queue."""

    spec: NodeSpec
    present: bool = True
    running: set[Request] = field(default_factory=set)  # holding a slot
    queued: int = 0  # waiting requests that need this node
    load_s: float = 0.0  # expected solo service seconds of its running and queued requests
    cache: PrefixCache | None = None  # its prefix cache, when the spec has one

    @property
    def busy(self) -> int:  # slots in use
        return len(self.running)

    @property
    def held(self) -> int:
        """Requests it holds, running and queued (what its agent reports, issue 31)."""
        return len(self.running) + self.queued


class Simulator:
    """One scenario run with one policy and one seed."""

    def __init__(self, scenario: Scenario, policy: str, seed: int,
                 config: RouterConfig | None = None) -> None:
        self.scenario = scenario
        self.seed = seed
        self.now = 0.0
        self.nodes: dict[str, NodeState] = {}
        config = config or RouterConfig()
        # One tracker (Router) per entry of scenario.trackers, each serving its own clients
        # and seeing only their requests in flight; their statistics gossip every gossip_s.
        self.routers = [self._tracker(config, policy, seed, k)
                        for k in range(max(len(scenario.trackers), 1))]
        self.router = self.routers[0]
        self.tracker_of = [k for k, n in enumerate(scenario.trackers) for _ in range(n)]
        # Several trackers: Σ |a tracker's view of a route's load - the truth| and how many
        # views, at every decision; Σ age of the nodes' last reports and how many.
        self.load_error = [0.0, 0]
        self.report_age = [0.0, 0]
        self.conversing = scenario.conversations is not None
        self.requests = (draw_conversations(scenario, scenario.conversations,
                                            random.Random(seed))
                         if scenario.conversations is not None
                         else draw_requests(scenario, random.Random(seed)))
        self._fresh = [r for r in self.requests if r.turn_of == 0] if self.conversing else []
        self._fresh.reverse()  # popped from the end: first conversation first
        self._arrived = 0
        self._events = sorted(scenario.events, key=lambda e: e.at_request)
        self._heap: list[tuple[float, int, int, Request | None, int]] = []
        self._seq = 0
        self._waiting: list[Request] = []
        self._next = 0
        self.current: Request | None = None  # the request being decided
        self.done: dict[int, tuple[float, int, bool]] = {}
        for spec in scenario.nodes:
            self._join(spec)

    def _tracker(self, config: RouterConfig, policy: str, seed: int, k: int) -> Router:
        """Tracker k's Router: the policy under test, or the oracle / fixed split (which
        read the simulator's ground truth); the first keeps the single tracker's rng."""
        chosen = (OraclePolicy(self) if policy == "oracle"
                  else FixedSplitPolicy(self) if policy == FIXED_SPLIT else None)
        return Router(config if chosen else replace(config, policy=policy),
                      clock=lambda: self.now, rng=random.Random(seed * 7919 + 17 + 1009 * k),
                      origin="local" if not k else f"tracker-{k}", policy=chosen)

    def router_of(self, req: Request) -> Router:
        """The tracker whose client sent the request."""
        if len(self.routers) == 1:
            return self.router
        return self.routers[self.tracker_of[req.client % len(self.tracker_of)]]

    # -- ground truth ---------------------------------------------------------------
    def route_truth(self, route: Route) -> tuple[tuple[float, ...], float, float, float]:
        """(solo compute seconds per token per hop, link seconds per token, latency seconds,
        failure probability) of a route right now."""
        compute, latency, ok_p = [], 0.0, 1.0
        for hop in route.hops:
            spec = self.nodes[hop.node.node_id].spec
            compute.append((hop.end_layer - hop.start_layer + 1) * spec.s_per_layer)
            latency += spec.latency_s
            ok_p *= 1.0 - spec.fail_rate
        hop_s = (len(route.hops) - 1) * self.scenario.hop_token_s
        return tuple(compute), hop_s, latency, 1.0 - ok_p

    def per_token_s(self, nodes: tuple[str, ...], compute: tuple[float, ...], hop_s: float,
                    extra: frozenset[str] = frozenset()) -> float:
        """Seconds per token of a request on these nodes at their current batch sizes (one
        more request on the nodes in `extra`), noise aside."""
        total = hop_s
        for node_id, c in zip(nodes, compute, strict=True):
            n = self.nodes[node_id]
            total += c * n.spec.slowdown(n.busy + (node_id in extra))
        return total

    def expected_wait_s(self, node_id: str) -> float:
        """The oracle's estimate of how long a new request waits for a slot on a node."""
        n = self.nodes[node_id]
        ahead = n.busy + n.queued
        if ahead < n.spec.slots:
            return 0.0
        return (ahead + 1 - n.spec.slots) / n.spec.slots * (n.load_s / ahead)

    def prefill_s(self, route: Route, prompt: Prefix | None) -> float:
        """Seconds the route would spend prefilling this prompt now, caches known."""
        if prompt is None:
            return 0.0
        total = 0.0
        for hop in route.hops:
            state = self.nodes[hop.node.node_id]
            spec = state.spec
            if spec.prefill_tps > 0:
                cached = state.cache.match(prompt, touch=False) if state.cache else 0
                share = (hop.end_layer - hop.start_layer + 1) / spec.layers
                total += (prompt.prompt_tokens - cached) * share / spec.prefill_tps
        return total

    def can_start(self, node_ids: tuple[str, ...]) -> bool:
        """Whether a request on these nodes would start at once (a free slot, no queue)."""
        return all(self.nodes[n].busy < self.nodes[n].spec.slots and not self.nodes[n].queued
                   for n in node_ids)

    def gain(self, route: Route, tokens: int) -> float:
        """The oracle's score of a route for a request: see `oracle.gain_score`."""
        return gain_score(self, route, tokens)

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
            for client in range(min(self.scenario.clients, len(self.requests))):
                self._push(0.0, ARRIVE, None, client)
        if self.scenario.announce_s > 0:
            self._push(self.scenario.announce_s, ANNOUNCE, None)
        if len(self.routers) > 1:
            self._push(self.scenario.gossip_s, GOSSIP, None)
        while self._heap:
            t, _, kind, req, version = heapq.heappop(self._heap)
            if req is not None and kind == FINISH and version != req.version:
                continue  # re-rated since
            self.now = t
            if kind == ARRIVE:
                self._arrive(req, version)
            elif kind == FINISH:
                assert req is not None
                self._finish(req)
            elif kind == TOKENS:
                assert req is not None
                self._begin_tokens(req)
            elif kind == GOSSIP:
                self._gossip()
            else:
                self._announce()
        return trace_of(self.requests, self.done)

    def _push(self, t: float, kind: int, req: Request | None, version: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, req, version))

    def _arrive(self, req: Request | None, client: int = 0) -> None:
        if req is None:  # closed loop: the next request of the sequence
            if self._next >= len(self.requests):
                return
            if self.conversing:
                if not self._fresh:
                    return
                req = self._fresh.pop()
            else:
                req = self.requests[self._next]
            req.arrival_s = self.now
            req.client = client
        if self.conversing:  # numbered in arrival order (events count arrivals)
            req.index, req.arrival_s = self._arrived, self.now
            self._arrived += 1
        self._next = max(self._next, req.index + 1)
        while self._events and self._events[0].at_request <= req.index:
            self._apply(self._events.pop(0))
        self.current = req
        router = self.router_of(req)
        if len(self.routers) > 1:
            self._view_error(router)
        try:
            decision = (router.choose(MODEL, max_tokens=req.max_tokens, prefix=req.prompt)
                        if req.prompt is not None
                        else router.choose(MODEL, max_tokens=req.max_tokens))
        except MeshRouteError:
            self._end(req, ok=False)
            return
        self._dispatch(req, decision)

    def _dispatch(self, req: Request, decision: Decision) -> None:
        route = decision.route
        scores = [self.gain(r, req.tokens) for r in self.router.candidates(MODEL)]
        req.good = self.gain(route, req.tokens) >= max(scores) * (1.0 - GOOD_WITHIN)
        req.compute_s, req.hop_s, req.latency_s, req.fail_p = self.route_truth(route)
        req.decision, req.nodes = decision, route.node_ids
        if req.prompt is not None:
            req.prefill_s = tuple(
                (h.end_layer - h.start_layer + 1) / spec.layers / spec.prefill_tps
                if (spec := self.nodes[h.node.node_id].spec).prefill_tps > 0 else 0.0
                for h in route.hops)
        req.service_s = req.tokens * (sum(req.compute_s) + req.hop_s) + req.latency_s
        cut = req.cut_u if req.fail_u < req.fail_p else 1.0
        req.tokens_left = req.tokens * cut
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
        started: list[Request] = []
        for req in self._waiting:
            nodes = [self.nodes[n] for n in req.nodes]
            if blocked.isdisjoint(req.nodes) and all(n.busy < n.spec.slots for n in nodes):
                for node in nodes:
                    node.queued -= 1
                    node.running.add(req)
                started.append(req)
            else:
                blocked.update(req.nodes)
                still.append(req)
        self._waiting = still
        for req in started:
            delay = req.latency_s + (self._prefill(req) if req.prompt is not None else 0.0)
            req.ttfb_s = self.now - req.arrival_s + delay
            if delay > 0:
                self._push(self.now + delay, TOKENS, req)
            else:
                self._begin_tokens(req)
        if started:
            self._rerate({n for r in started for n in r.nodes})

    def _prefill(self, req: Request) -> float:
        """Seconds to prefill the prompt's uncached tokens on every hop (noise as decode)."""
        assert req.prompt is not None
        total = 0.0
        prompt = req.prompt
        for k, (node_id, per_token) in enumerate(zip(req.nodes, req.prefill_s, strict=True)):
            cache = self.nodes[node_id].cache
            cached = cache.match(prompt) if cache is not None else 0
            if k == 0:
                req.cached_tokens = cached
            total += (prompt.prompt_tokens - cached) * per_token
        return total * req.noise

    def _begin_tokens(self, req: Request) -> None:
        if self.scenario.load_view == ANSWERS:  # the answer's header: its nodes' load
            router = self.router_of(req)
            for node_id in req.nodes:
                router.note_load(node_id, self.nodes[node_id].held)
        req.updated_s = self.now
        req.rate = 1.0  # marks the token phase; _rerate sets the true rate
        per_token = self.per_token_s(req.nodes, req.compute_s, req.hop_s) * req.noise
        req.ttfb_s += per_token
        self._rerate(set(req.nodes))

    def _rerate(self, node_ids: set[str]) -> None:
        """Batch sizes changed on these nodes: advance and re-time their running requests."""
        touched = {r for n in node_ids if n in self.nodes for r in self.nodes[n].running}
        for req in sorted(touched, key=lambda r: r.index):
            if req.rate <= 0:
                continue  # still paying its fixed latency
            req.tokens_left = max(req.tokens_left - req.rate * (self.now - req.updated_s), 0.0)
            req.updated_s = self.now
            req.rate = 1.0 / (self.per_token_s(req.nodes, req.compute_s, req.hop_s)
                              * req.noise)
            req.version += 1
            self._push(self.now + req.tokens_left / req.rate, FINISH, req, req.version)

    def _finish(self, req: Request) -> None:
        for node_id in req.nodes:
            node = self.nodes[node_id]
            node.running.discard(req)
            node.load_s -= req.service_s
        req.rate = 0.0
        self._rerate(set(req.nodes))
        ok = req.fail_u >= req.fail_p
        if ok and req.prompt is not None:  # the prompt and the answer are cached now
            kept = req.prompt.extended(req.answer_key, req.tokens)
            for node_id in req.nodes:
                cache = self.nodes[node_id].cache
                if cache is not None:
                    cache.store(kept)
        self._end(req, ok=ok)
        self._start_waiting()

    def _end(self, req: Request, *, ok: bool, error: ErrorKind = "stream") -> None:
        """Report the outcome to the router and log it; a closed-loop client sends again."""
        seconds = self.now - req.arrival_s
        if req.decision is not None:
            outcome = (Outcome(req.tokens, seconds, min(seconds, req.ttfb_s)) if ok
                       else Outcome(0, seconds, 0.0, error))
            self.router_of(req).record(req.decision, outcome)
        self.done[req.index] = (self.now, req.tokens if ok else 0, not ok)
        if self.scenario.poisson_rate <= 0:
            nxt = req.next_turn if self.conversing else None
            if nxt is not None:
                nxt.client = req.client
            self._push(self.now, ARRIVE, nxt, req.client)

    # -- topology -----------------------------------------------------------------------
    def _announce(self) -> None:
        """Every node re-announces its record with its current queue depth (a refresh)."""
        if len(self.done) == len(self.requests):
            return  # the run is over
        for state in self.nodes.values():
            if state.present:
                record = state.spec.record(self._advertised(state.spec))
                for router in self.routers:
                    router.upsert_node(replace(record, queue=state.queued))
                    if self.scenario.load_view == ANSWERS:  # the agent pushes its reading
                        router.note_load(state.spec.node_id, state.held)
        self._push(self.now + self.scenario.announce_s, ANNOUNCE, None)

    def _view_error(self, router: Router) -> None:
        """Before a decision: how far the tracker's view of each route's load is from the
        truth (issue 31's staleness), and with `exact` the truth handed to it first."""
        now = self.now
        present = [n for n, s in self.nodes.items() if s.present]
        if self.scenario.load_view == EXACT:
            for node_id in present:
                router.note_load(node_id, self.nodes[node_id].held)
        for arm in router.arms(MODEL, now):
            truth = max(self.nodes[n].held for n in arm.route.node_ids)
            self.load_error[0] += abs(arm.in_flight - truth)
            self.load_error[1] += 1
        for node_id in present:
            age = router.loads.age(node_id, now)
            if age is not None:
                self.report_age[0] += age
                self.report_age[1] += 1

    def _gossip(self) -> None:
        """One round of statistics gossip: every tracker merges every other's state (as
        push-pull anti-entropy converges to, without loss or delay)."""
        if len(self.done) == len(self.requests):
            return  # the run is over
        states = [r.stats.state() for r in self.routers]
        for k, router in enumerate(self.routers):
            for j, state in enumerate(states):
                if j != k:
                    router.stats.merge(state, self.now)
        self._push(self.now + self.scenario.gossip_s, GOSSIP, None)

    def _join(self, spec: NodeSpec) -> None:
        state = self.nodes.get(spec.node_id)
        if state is None:
            state = self.nodes[spec.node_id] = NodeState(spec)
        else:
            state.spec, state.present = spec, True
        # A node that (re)joins starts with an empty prefix cache.
        state.cache = (PrefixCache(spec.cache_tokens,
                                   spec.slots if spec.cache_per_slot else None)
                       if spec.cache_tokens > 0 else None)
        for router in self.routers:
            router.upsert_node(spec.record(self._advertised(spec)))

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
        elif event.kind in ("slow", "fail"):
            state = self.nodes[event.node_id]
            if event.kind == "slow":  # prefill slows with decode (the same hardware)
                spec = replace(state.spec, s_per_layer=state.spec.s_per_layer * event.factor,
                               prefill_tps=state.spec.prefill_tps / event.factor)
            else:
                spec = replace(state.spec, fail_rate=event.factor)
            state.spec = spec
            if event.kind == "slow":  # the new speed applies to the batch now running
                for req in state.running:
                    at = req.nodes.index(event.node_id)
                    compute = list(req.compute_s)
                    compute[at] *= event.factor
                    req.compute_s = tuple(compute)
                self._rerate({event.node_id})

    def _leave(self, node_id: str) -> None:
        """A node leaves: running requests drain, waiting ones fail to connect."""
        self.nodes[node_id].present = False
        for router in self.routers:
            router.remove_node(node_id)
        stranded = [r for r in self._waiting if node_id in r.nodes]
        self._waiting = [r for r in self._waiting if node_id not in r.nodes]
        for req in stranded:
            for n in req.nodes:
                self.nodes[n].queued -= 1
                self.nodes[n].load_s -= req.service_s
            self._end(req, ok=False, error="connect")
        self._start_waiting()


def run(scenario: Scenario, policy: str, seed: int) -> Trace:
    """Run one scenario with one policy (a registered name, or "oracle") and seed."""
    return Simulator(scenario, policy, seed).run()
