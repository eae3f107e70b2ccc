"""What the gateway tells the world: events on the bus and Prometheus metrics."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .core import Decision, Outcome, Router
from .events import EventBus

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class _RouterCollector(Collector):
    """Learned statistics read from the router at scrape time (nothing kept twice)."""

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
        for model, entry in self.router.routing_table()["models"].items():
            topo = self.router.topology.model(model)
            nodes.add_metric([model], len(topo.nodes) if topo else 0)
            epoch.add_metric([model], entry["epoch"])
            for row in entry["candidates"]:
                if row["tps"] is not None:
                    tps.add_metric([model, row["signature"], row["status"]], row["tps"])
                weight.add_metric([model, row["signature"]], row["weight"])
        yield from (tps, weight, nodes, epoch)


class _CallbackCollector(Collector):
    def __init__(self, produce: Callable[[], Iterable[Metric]]) -> None:
        self.produce = produce

    def collect(self) -> Iterator[Metric]:
        yield from self.produce()


class Telemetry:
    """Events and metrics of one gateway; its own registry, so several can live in a process."""

    def __init__(self, router: Router, events: EventBus | None = None) -> None:
        self.events = events or EventBus()
        self.registry = CollectorRegistry()
        r = self.registry
        self.decisions = Counter("meshroute_decisions", "Routing decisions",
                                 ["model", "mode"], registry=r)
        self.outcomes = Counter("meshroute_outcomes", "Finished attempts by result",
                                ["model", "result"], registry=r)
        self.forward_errors = Counter("meshroute_forward_errors",
                                      "Failures of a route head before its first byte",
                                      ["kind"], registry=r)
        self.rejected = Counter("meshroute_rejected", "Rejected hostile or malformed input",
                                ["source"], registry=r)
        self.in_flight = Gauge("meshroute_in_flight", "Requests being served", registry=r)
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self.registry.register(_RouterCollector(router))

    def add_collector(self, produce: Callable[[], Iterable[Metric]]) -> None:
        """Export more metrics (gossip, discovery) computed at scrape time."""
        self.registry.register(_CallbackCollector(produce))

    def _count(self, counter: Counter, *labels: str) -> None:
        """Increment a labelled counter; children are cached (labels() costs microseconds)."""
        key = (id(counter), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = counter.labels(*labels)
        child.inc()

    def decided(self, decision: Decision) -> None:
        """A route was selected for an attempt."""
        self._count(self.decisions, decision.model, decision.mode)
        self.events.publish("route-selected", decision.event())

    def finished(self, decision: Decision, outcome: Outcome, result: str) -> None:
        """An attempt ended; `result` is what the router made of it."""
        self._count(self.outcomes, decision.model, result)
        if outcome.error and result == "failure":
            self._count(self.forward_errors, outcome.error)
        tps = (outcome.completion_tokens / outcome.seconds
               if outcome.ok and outcome.seconds > 0 else None)
        self.events.publish("outcome", {
            **decision.event(), "ok": outcome.ok, "result": result,
            "completion_tokens": outcome.completion_tokens,
            "seconds": round(outcome.seconds, 6), "ttfb_ms": round(outcome.ttfb_s * 1000, 3),
            "tps": tps, "error": outcome.error or None})

    def reject(self, source: str, reason: str) -> None:
        """Hostile or malformed input was refused."""
        self.rejected.labels(source).inc()
        self.events.publish("rejected", {"source": source, "reason": reason[:300]})

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
