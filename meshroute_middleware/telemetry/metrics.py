"""What the gateway tells the world: events on the bus and Prometheus metrics.

Every chat request passes through `decided` and `finished` (a mesh attempt) or
`provider_decided` and `provider_finished` (a provider key's attempt), so they only bump plain
counters and queue lazy events; the Prometheus families are built from those counters at
scrape time.

A provider attempt publishes the same `route-selected` and `outcome` events as a mesh attempt,
with `mode` "provider", `model` the provider route (`fastco/big-model`), `signature` the key
route taken (`fastco/big-model#1`: the key's position, never the key), `head` the provider's
name, and two fields of its own: `chain` (the model the client asked for: `auto`, ...) and,
after a 429, `cooldown_until` (when the key may be used again, on the gateway's clock).
Every event names the request's `objective` (issue 26: `throughput`, `ttft` or `cost`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from meshroute_middleware.core import Decision, Outcome, Router
from meshroute_middleware.core.kinds import (
    CLIENT_ERROR,
    CONNECT,
    CONTEXT,
    HTTP_5XX,
    HTTP_429,
    TIMEOUT,
    ErrorKind,
)
from meshroute_middleware.core.objectives import DEFAULT_OBJECTIVE, OBJECTIVES, Objective
from meshroute_middleware.core.providers.exhaustion import PassedOver
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.core.providers.scoring import OutcomeKind
from meshroute_middleware.telemetry.client_metrics import OTHER_MODEL
from meshroute_middleware.telemetry.events import EventBus, Payload
from meshroute_middleware.telemetry.requests import RequestTally
from meshroute_middleware.telemetry.services import ServiceStates

if TYPE_CHECKING:
    from meshroute_middleware.telemetry.workers import WorkerMetrics

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Families every worker of `--workers N` knows alike (learned and shared state): a scrape shows
# the answering worker's; every other family is each worker's own, merged (worker_files.py).
SHARED_FAMILIES = frozenset({"meshroute_route_tps", "meshroute_route_weight", "meshroute_nodes",
                             "meshroute_topology_epoch", "meshroute_provider_key_state",
                             "meshroute_provider_key_wait_seconds"})


class _RouterCollector(Collector):
    """Learned statistics read from the router at scrape time (nothing kept twice). It reads
    the merged views only: no traffic shares, so no Monte-Carlo draws on a scrape."""

    def __init__(self, router: Router) -> None:
        self.router = router

    def collect(self) -> Iterator[Metric]:
        tps = GaugeMetricFamily("meshroute_route_tps", "Learned tokens/s of a route",
                                labels=["model", "signature", "status"])
        weight = GaugeMetricFamily("meshroute_route_weight", "Decayed sample mass of a route",
                                   labels=["model", "signature"])
        nodes = GaugeMetricFamily("meshroute_nodes", "Nodes in the topology", labels=["model"])
        epoch = GaugeMetricFamily("meshroute_topology_epoch", "Topology epoch",
                                  labels=["model"])
        now = self.router.clock()
        for model in self.router.models():
            topo = self.router.topology.model(model)
            nodes.add_metric([model], len(topo.nodes) if topo else 0)
            epoch.add_metric([model], topo.epoch if topo else 0)
            for arm in self.router.arms(model, now):
                view = arm.view
                if view.tps is not None:
                    tps.add_metric([model, arm.signature, view.status], view.tps)
                weight.add_metric([model, arm.signature], view.mass)
        yield from (tps, weight, nodes, epoch)


KEY_STATES = ("ready", "cooldown", "limited")
# A provider attempt's failure reason (core.providers.exhaustion.ATTEMPT_REASONS) as an ErrorKind.
_PROVIDER_ERRORS: dict[str, ErrorKind] = {"http_429": HTTP_429, "http_5xx": HTTP_5XX,
                                          "timeout": TIMEOUT, "connect": CONNECT,
                                          "context": CONTEXT}


def provider_outcome(kind: OutcomeKind, over: PassedOver | None, completion_tokens: int,
                     seconds: float, ttfb_ms: float | None, *,
                     sampled: bool) -> tuple[Outcome, str, float | None]:
    """A provider attempt as a mesh attempt is told: (its Outcome, the result, the key's
    cooldown end after a 429). `over`: what the ProviderRouter made of it; `sampled`: its
    tokens/s was a sample."""
    ttfb_s = ttfb_ms / 1000 if ttfb_ms is not None else seconds
    if kind is OutcomeKind.SUCCESS:
        return (Outcome(completion_tokens, seconds, ttfb_s, ""),
                "sample" if sampled else "success", None)
    if kind is OutcomeKind.CLIENT_ERROR:
        error = _PROVIDER_ERRORS.get(over.reason, CLIENT_ERROR) if over else CLIENT_ERROR
        return Outcome(0, seconds, ttfb_s, error), "client_error", None
    error = _PROVIDER_ERRORS.get(over.reason, HTTP_5XX) if over is not None else HTTP_5XX
    until = over.until if over is not None and kind is OutcomeKind.RATE_LIMITED else None
    return Outcome(0, seconds, ttfb_s, error), "failure", until


def provider_key_families(providers: ProviderRouter, now: float) -> Iterator[Metric]:
    """Each provider key's state (1 for the state it is in) and seconds left of its cooldown
    or limit, read from the ProviderRouter at scrape time."""
    state = GaugeMetricFamily("meshroute_provider_key_state",
                              "Provider key state: 1 for the state the key is in",
                              labels=["route", "key", "state"])
    left = GaugeMetricFamily("meshroute_provider_key_wait_seconds",
                             "Seconds until a cooling or limited provider key may be used",
                             labels=["route", "key"])
    for provider in providers.cfg.providers:
        for model in provider.models:
            route = f"{provider.name}/{model.id}"
            for row in providers.gates.key_states(provider, model, now):
                key = str(row["key"])
                for name in KEY_STATES:
                    state.add_metric([route, key, name], 1.0 if row["state"] == name else 0.0)
                until = row["until"]
                left.add_metric([route, key], max(0.0, until - now) if until else 0.0)
    yield from (state, left)


class _CallbackCollector(Collector):
    def __init__(self, produce: Callable[[], Iterable[Metric]]) -> None:
        self.produce = produce

    def collect(self) -> Iterator[Metric]:
        yield from self.produce()


MAX_MODEL_SERIES = 4096  # (model, mode) and (model, result) label sets, each; then "other"


def _bump(table: dict[tuple[str, str], int], key: tuple[str, str]) -> None:
    """Count one in `table`; a new label set past MAX_MODEL_SERIES is counted as `other`
    (models never outnumber nodes in the topology, and leave /metrics with it: this bounds
    what the two together might still miss)."""
    count = table.get(key)
    if count is None and len(table) >= MAX_MODEL_SERIES:
        key = (OTHER_MODEL, key[1])
        count = table.get(key)
    table[key] = (count or 0) + 1


MAX_REJECTED_SERIES = 256  # label sets of meshroute_rejected; sources and reasons are fixed words


def _rejected(counts: dict[tuple[str, str], int]) -> CounterMetricFamily:
    """meshroute_rejected{source} and, where a reason kind was given, {source, reason}: the
    series without a reason stay as they were before reasons were added."""
    family = CounterMetricFamily("meshroute_rejected", "Rejected hostile or malformed input")
    for (source, kind), value in sorted(counts.items()):
        labels = {"source": source, "reason": kind} if kind else {"source": source}
        family.add_sample("meshroute_rejected_total", labels, value)
    return family


def _counter(name: str, documentation: str, labels: list[str],
             counts: dict[Any, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=labels)
    for key, value in sorted(counts.items()):
        family.add_metric(list(key) if isinstance(key, tuple) else [key], value)
    return family


# An event keeps atoms (str, int, float, None) until read, never the Decision itself: a
# retained Decision (its route, its arms) would be scanned by every garbage collection for as
# long as it stays in the history (docs/benchmarks.md). Plain tuples, not NamedTuples: one is
# built per event on every request, and a NamedTuple costs ~3x the time to build.
# mode, signature, model, attempt, head node, objective
Selected = tuple[str, str, str, int, str, str]


def _selected(decision: Decision) -> Selected:
    return (decision.mode, decision.route.signature, decision.model, decision.attempt,
            decision.route.hops[0].node.node_id, decision.objective)


def _provider_selected(route: str, key_route: str, attempt: int, objective: str) -> Selected:
    return (PROVIDER_MODE, key_route, route, attempt, route.partition("/")[0], objective)


def _selected_fields(selected: Selected) -> Payload:
    mode, signature, model, attempt, head, objective = selected
    return {"mode": mode, "signature": signature, "model": model, "attempt": attempt,
            "head": head, "objective": objective}


# A provider attempt: its Selected, the client's model (the chain), and after a 429 the key's
# cooldown end (None otherwise).
ProviderSelected = tuple[Selected, str]
ProviderFinished = tuple[Selected, str, Outcome, str, float | None]
PROVIDER_MODE = "provider"


def _provider_selected_fields(event: ProviderSelected) -> Payload:
    selected, chain = event
    return {**_selected_fields(selected), "chain": chain}


def _provider_outcome_fields(event: ProviderFinished) -> Payload:
    selected, chain, outcome, result, until = event
    fields = {**_outcome_fields((selected, outcome, result)), "chain": chain}
    if until is not None:
        fields["cooldown_until"] = until
    return fields


def _outcome_fields(event: tuple[Selected, Outcome, str]) -> Payload:
    selected, outcome, result = event
    ok = not outcome.error
    tps = outcome.tps  # the core's one tokens/s rule
    return {**_selected_fields(selected), "ok": ok, "result": result,
            "completion_tokens": outcome.completion_tokens,
            "seconds": round(outcome.seconds, 6), "ttfb_ms": round(outcome.ttfb_s * 1000, 3),
            "tps": tps, "error": outcome.error or None}


def _embeddings_provider_outcome_fields(event: ProviderFinished) -> Payload:
    return {**_provider_outcome_fields(event), "kind": "embeddings"}


def _embeddings_outcome_fields(event: tuple[Selected, Outcome, str]) -> Payload:
    return {**_outcome_fields(event), "kind": "embeddings"}


def _route_in_flight(name: str, text: str, router: Router) -> GaugeMetricFamily:
    """`router`'s own attempts open on each mesh route (routes with none left out: a route's
    series comes and goes with its traffic, bounded by the routes in use)."""
    family = GaugeMetricFamily(name, text, labels=["signature"])
    for signature, count in sorted(router.own_in_flight().items()):
        family.add_metric([signature], count)
    return family


class Telemetry:
    """Events and metrics of one gateway; its own registry, so several can live in a process."""

    def __init__(self, router: Router, events: EventBus | None = None,
                 embeddings_router: Router | None = None) -> None:
        self.events = events or EventBus()
        self.embeddings_router = embeddings_router  # embeddings' own statistics and counts
        self.registry = CollectorRegistry()
        self.decisions: dict[tuple[str, str], int] = {}  # (model, mode) -> n
        self.outcomes: dict[tuple[str, str], int] = {}  # (model, result) -> n
        self.forward_errors: dict[str, int] = {}  # kind -> n
        self.rejected: dict[str, int] = {}  # source -> n
        self.rejected_by: dict[tuple[str, str], int] = {}  # (source, reason kind) -> n
        self.failovers: dict[str, int] = {}  # model -> answers continued mid-stream (issue 34)
        # chat requests routed, by the objective they asked for (issue 26; /v1/routing)
        self._objectives: dict[str, int] = dict.fromkeys(OBJECTIVES, 0)
        self.services = ServiceStates()  # the supervised background services (/healthz)
        self.in_flight = 0  # chat requests being served
        # Chat requests by what their client got; kept by the MeshRouteMiddleware that
        # serves them (None where none does: the mitm addon counts attempts only).
        self.requests: RequestTally | None = None
        # (when, exposition), by whether it holds per-client series
        self._rendered: dict[bool, tuple[float, bytes]] = {}
        self._learned = _RouterCollector(router)
        self._collectors: list[Collector] = [_CallbackCollector(self._families)]
        self.registry.register(self._learned)
        self.registry.register(self._collectors[0])
        # series labelled by client, for the admin and loopback, and their sums without the
        # label for everyone else (docs/security.md, "Who sees spend")
        self._per_client = CollectorRegistry()
        self._aggregate = CollectorRegistry()
        self._client_collectors: list[Collector] = []
        # a worker of `--workers N`: /metrics and /v1/routing's counts are every worker's
        self.workers: WorkerMetrics | None = None

    @property
    def objectives(self) -> dict[str, int]:
        """Chat requests routed, by the objective they asked for: the whole gateway's."""
        if self.workers is not None:
            return self.workers.counts(self).objectives
        return self._objectives

    def _families(self) -> Iterator[Metric]:
        yield _counter("meshroute_decisions", "Routing decisions", ["model", "mode"],
                       self.decisions)
        yield _counter("meshroute_outcomes", "Finished attempts by result",
                       ["model", "result"], self.outcomes)
        yield _counter("meshroute_forward_errors",
                       "Failures of a route head before its first byte", ["kind"],
                       self.forward_errors)
        yield _rejected(self.rejected_by)
        yield _counter("meshroute_failovers", "Answers continued on another route after "
                       "theirs failed mid-stream", ["model"], self.failovers)
        if self.requests is not None:
            yield _counter("meshroute_requests", "Chat requests by what their client got: "
                           "answered (a 200 that did not end in an error) or failed",
                           ["result"], self.requests.to_local_dict())
        yield _counter("meshroute_objective_requests",
                       "Chat requests routed, by the objective they asked for", ["objective"],
                       self._objectives)
        yield from self.services.metric_families()
        yield _counter("meshroute_events_dropped",
                       "Events a slow /v1/routing/events subscriber missed", [],
                       {(): self.events.dropped})
        yield _counter("meshroute_event_subscribers_dropped",
                       "/v1/routing/events subscribers closed to make room for newer ones", [],
                       {(): self.events.subscribers_dropped})
        subscribers = GaugeMetricFamily("meshroute_event_subscribers",
                                        "Open /v1/routing/events streams")
        subscribers.add_metric([], self.events.subscriber_count)
        yield subscribers
        in_flight = GaugeMetricFamily("meshroute_in_flight", "Requests being served")
        in_flight.add_metric([], self.in_flight)
        yield in_flight
        yield _route_in_flight("meshroute_route_in_flight", "Attempts in flight on a mesh route",
                               self._learned.router)
        if self.embeddings_router is not None:
            yield _route_in_flight("meshroute_embeddings_route_in_flight",
                                   "Embeddings attempts in flight on a mesh route",
                                   self.embeddings_router)

    def route_in_flight(self, kind: str = "chat") -> dict[str, int] | None:
        """Each mesh route's attempts in flight in the whole gateway, every worker's, of chat
        or of `embeddings` (None: one process, whose routing table counts its own already)."""
        if self.workers is None:
            return None
        counts = self.workers.counts(self)
        return counts.embeddings_in_flight if kind == "embeddings" else counts.in_flight

    def add_collector(self, produce: Callable[[], Iterable[Metric]]) -> None:
        """Export more metrics (gossip, discovery) computed at scrape time."""
        collector = _CallbackCollector(produce)
        self._collectors.append(collector)
        self.registry.register(collector)

    def add_client_collector(self, per_client: Callable[[], Iterable[Metric]],
                             aggregate: Callable[[], Iterable[Metric]]) -> None:
        """Export series labelled by client (`per_client`), shown only to whom may see each
        client's spend; everyone else gets `aggregate`, the same sums without the label."""
        collector = _CallbackCollector(per_client)
        self._client_collectors.append(collector)
        self._per_client.register(collector)
        self._aggregate.register(_CallbackCollector(aggregate))

    def own_families(self) -> tuple[list[Metric], list[Metric]]:
        """(this process's own families, each client's spend): what a worker of `--workers N`
        counts itself, as opposed to the SHARED_FAMILIES every worker knows alike."""
        own = [m for c in self._collectors for m in c.collect() if m.name not in SHARED_FAMILIES]
        return own, [m for c in self._client_collectors for m in c.collect()]

    def shared_families(self) -> list[Metric]:
        """The SHARED_FAMILIES, as this process knows them."""
        return [*self._learned.collect(),
                *(m for c in self._collectors for m in c.collect() if m.name in SHARED_FAMILIES)]

    def asked(self, objective: Objective) -> None:
        """A chat request is routed by `objective`."""
        self._objectives[objective] += 1

    def decided(self, decision: Decision) -> None:
        """A route was selected for an attempt."""
        _bump(self.decisions, (decision.model, decision.mode))
        self.events.publish_lazy("route-selected", _selected_fields, _selected(decision))

    def failover(self, failed: Decision, following: Decision, error: str) -> None:
        """`failed` broke off mid-stream (`error`); its answer goes on on `following`."""
        self.failovers[failed.model] = self.failovers.get(failed.model, 0) + 1
        self.events.publish("failover", {"model": failed.model, "from": failed.signature,
                                         "to": following.signature, "error": error})

    def finished(self, decision: Decision, outcome: Outcome, result: str,
                 kind: str = "chat") -> None:
        """An attempt ended; `result` is what the router made of it. An embeddings attempt's
        event says `kind: "embeddings"` (its `tps` is inputs per second)."""
        _bump(self.outcomes, (decision.model, result))
        if outcome.error and result == "failure":
            self.forward_errors[outcome.error] = self.forward_errors.get(outcome.error, 0) + 1
        if kind == "embeddings":
            self.events.publish_lazy("outcome", _embeddings_outcome_fields,
                                     (_selected(decision), outcome, result))
            return
        self.events.publish_lazy("outcome", _outcome_fields,
                                 (_selected(decision), outcome, result))

    def provider_decided(self, chain: str, route: str, key_route: str, attempt: int,
                         objective: Objective = DEFAULT_OBJECTIVE) -> None:
        """A provider key was taken for an attempt: `route` `fastco/big-model`, `key_route`
        `fastco/big-model#1`, `attempt` its 0-based place among the request's attempts."""
        _bump(self.decisions, (route, PROVIDER_MODE))
        self.events.publish_lazy("route-selected", _provider_selected_fields,
                                 (_provider_selected(route, key_route, attempt, objective),
                                  chain))

    def provider_finished(self, chain: str, route: str, key_route: str, attempt: int,
                          outcome: Outcome, result: str,
                          cooldown_until: float | None = None, kind: str = "chat",
                          objective: Objective = DEFAULT_OBJECTIVE) -> None:
        """A provider attempt ended: `result` is `sample`, `success`, `failure` (`error` its
        reason: `http_429`, `http_5xx`, `timeout`, `connect`) or `client_error` (the client's
        own 4xx, or `context`: the upstream's context is too small; blames nobody)."""
        _bump(self.outcomes, (route, result))
        if outcome.error and result == "failure":
            self.forward_errors[outcome.error] = self.forward_errors.get(outcome.error, 0) + 1
        self.events.publish_lazy(
            "outcome", _provider_outcome_fields if kind != "embeddings"
            else _embeddings_provider_outcome_fields,
            (_provider_selected(route, key_route, attempt, objective), chain, outcome, result,
             cooldown_until))

    def forget_model(self, model: str) -> None:
        """A model left the topology: its series leave /metrics (issue 22: 3,000 join / chat /
        leave cycles left 6,000 series behind)."""
        for table in (self.decisions, self.outcomes):
            for key in [k for k in table if k[0] == model]:
                del table[key]
        self.failovers.pop(model, None)

    def reject(self, source: str, reason: str, kind: str = "") -> None:
        """Hostile or malformed input was refused. `source` and `kind` are fixed words (the
        metric's labels: `kind` becomes `reason`), `reason` the text for the event."""
        self.rejected[source] = self.rejected.get(source, 0) + 1
        key = (source, kind)
        if key not in self.rejected_by and len(self.rejected_by) >= MAX_REJECTED_SERIES:
            key = ("other", "other")  # a bound on label sets, whatever a caller passes
        self.rejected_by[key] = self.rejected_by.get(key, 0) + 1
        self.events.publish("rejected", {"source": source, "reason": reason[:300]})

    def render(self, per_client: bool = True) -> bytes:
        """The Prometheus text exposition; without `per_client`, the client collectors'
        series summed over clients (no `client` label). A worker's: every worker's."""
        if self.workers is not None:
            return self.workers.render(self, per_client)
        return generate_latest(self.registry) + generate_latest(
            self._per_client if per_client else self._aggregate)

    def render_cached(self, now: float, max_age_s: float, per_client: bool = True) -> bytes:
        """The exposition, computed again only when the last one is `max_age_s` old (a
        worker's: the last one any worker computed, so that no scrape goes back in time)."""
        if self.workers is not None:
            return self.workers.render_cached(self, now, max_age_s, per_client)
        last = self._rendered.get(per_client)
        if last is None or not 0 <= now - last[0] < max_age_s:
            last = self._rendered[per_client] = (now, self.render(per_client))
        return last[1]
