"""What the gateway tells the world: events on the bus and Prometheus metrics.

Every chat request passes through `decided` and `finished`, so they only bump plain counters
and queue lazy events; the Prometheus families are built from those counters at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
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


def _counter(name: str, documentation: str, labels: list[str],
             counts: dict[Any, int]) -> CounterMetricFamily:
    family = CounterMetricFamily(name, documentation, labels=labels)
    for key, value in sorted(counts.items()):
        family.add_metric(list(key) if isinstance(key, tuple) else [key], value)
    return family


# Events keep only atoms (str, int, float, None) until read: a retained tuple of atoms is
# untracked by the garbage collector, where a retained Decision would be scanned by every
# collection for as long as it stays in the history.
_SELECTED_KEYS = ("mode", "signature", "model", "attempt", "head")
_OUTCOME_KEYS = (*_SELECTED_KEYS, "ok", "result", "completion_tokens", "seconds", "ttfb_ms",
                 "tps", "error")


def _selected(*values: Any) -> dict[str, Any]:
    return dict(zip(_SELECTED_KEYS, values, strict=True))


def _outcome(*values: Any) -> dict[str, Any]:
    event = dict(zip(_OUTCOME_KEYS, values, strict=True))
    event["seconds"] = round(event["seconds"], 6)
    event["ttfb_ms"] = round(event["ttfb_ms"] * 1000, 3)
    return event


class Telemetry:
    """Events and metrics of one gateway; its own registry, so several can live in a process."""

    def __init__(self, router: Router, events: EventBus | None = None) -> None:
        self.events = events or EventBus()
        self.registry = CollectorRegistry()
        self.decisions: dict[tuple[str, str], int] = {}  # (model, mode) -> n
        self.outcomes: dict[tuple[str, str], int] = {}  # (model, result) -> n
        self.forward_errors: dict[str, int] = {}  # kind -> n
        self.rejected: dict[str, int] = {}  # source -> n
        self.in_flight = 0  # chat requests being served
        self.registry.register(_RouterCollector(router))
        self.registry.register(_CallbackCollector(self._families))

    def _families(self) -> Iterator[Metric]:
        yield _counter("meshroute_decisions", "Routing decisions", ["model", "mode"],
                       self.decisions)
        yield _counter("meshroute_outcomes", "Finished attempts by result",
                       ["model", "result"], self.outcomes)
        yield _counter("meshroute_forward_errors",
                       "Failures of a route head before its first byte", ["kind"],
                       self.forward_errors)
        yield _counter("meshroute_rejected", "Rejected hostile or malformed input",
                       ["source"], self.rejected)
        in_flight = GaugeMetricFamily("meshroute_in_flight", "Requests being served")
        in_flight.add_metric([], self.in_flight)
        yield in_flight

    def add_collector(self, produce: Callable[[], Iterable[Metric]]) -> None:
        """Export more metrics (gossip, discovery) computed at scrape time."""
        self.registry.register(_CallbackCollector(produce))

    def decided(self, decision: Decision) -> None:
        """A route was selected for an attempt."""
        key = (decision.model, decision.mode)
        self.decisions[key] = self.decisions.get(key, 0) + 1
        self.events.publish_lazy("route-selected", _selected, decision.mode,
                                 decision.route.signature, decision.model, decision.attempt,
                                 decision.route.hops[0].node.node_id)

    def finished(self, decision: Decision, outcome: Outcome, result: str) -> None:
        """An attempt ended; `result` is what the router made of it."""
        key = (decision.model, result)
        self.outcomes[key] = self.outcomes.get(key, 0) + 1
        if outcome.error and result == "failure":
            self.forward_errors[outcome.error] = self.forward_errors.get(outcome.error, 0) + 1
        ok = not outcome.error
        tps = outcome.tps  # the core's one tokens/s rule
        self.events.publish_lazy(
            "outcome", _outcome, decision.mode, decision.route.signature, decision.model,
            decision.attempt, decision.route.hops[0].node.node_id, ok, result,
            outcome.completion_tokens, outcome.seconds, outcome.ttfb_s, tps,
            outcome.error or None)

    def reject(self, source: str, reason: str) -> None:
        """Hostile or malformed input was refused."""
        self.rejected[source] = self.rejected.get(source, 0) + 1
        self.events.publish("rejected", {"source": source, "reason": reason[:300]})

    def render(self) -> bytes:
        """The Prometheus text exposition."""
        return generate_latest(self.registry)
