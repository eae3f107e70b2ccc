"""Prometheus metric families of a GossipService, built at scrape time from its counters."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .service import GossipService


def metric_families(service: GossipService) -> Iterator[Metric]:
    """Counters (rounds, exchanges, messages, bytes, entries, rejections, entry refusals) and
    the peer gauge."""
    c = service.counters
    rounds = CounterMetricFamily("meshroute_gossip_rounds", "Gossip rounds run")
    rounds.add_metric([], c.rounds)
    exchanges = CounterMetricFamily("meshroute_gossip_exchanges",
                                    "Push-pull exchanges this tracker initiated", labels=["result"])
    exchanges.add_metric(["ok"], c.exchanges - c.exchange_failures)
    exchanges.add_metric(["failed"], c.exchange_failures)
    messages = CounterMetricFamily("meshroute_gossip_messages", "Gossip frames",
                                   labels=["direction"])
    messages.add_metric(["sent"], c.messages_sent)
    messages.add_metric(["received"], c.messages_received)
    sizes = CounterMetricFamily("meshroute_gossip_bytes", "Gossip frame bytes",
                                labels=["direction"])
    sizes.add_metric(["sent"], c.bytes_sent)
    sizes.add_metric(["received"], c.bytes_received)
    entries = CounterMetricFamily("meshroute_gossip_entries", "Received statistics entries",
                                  labels=["result"])
    entries.add_metric(["applied"], c.entries_applied)
    entries.add_metric(["ignored"], c.entries_ignored)
    rejected = CounterMetricFamily("meshroute_gossip_rejected",
                                   "Refused gossip messages and failed exchanges",
                                   labels=["reason"])
    for reason, n in sorted(c.rejected.items()):
        rejected.add_metric([reason], n)
    refused = CounterMetricFamily("meshroute_gossip_entries_refused",
                                  "Received entries and change times refused one by one",
                                  labels=["reason"])
    for reason, n in sorted(c.entries_refused.items()):
        refused.add_metric([reason], n)
    peers = GaugeMetricFamily("meshroute_gossip_peers", "Known gossip peers")
    peers.add_metric([], len(service.membership.peers()))
    yield from (rounds, exchanges, messages, sizes, entries, rejected, refused, peers)
