"""What each configured client spent, as Prometheus counters (issue 24): /metrics shows them
by client to the admin and loopback, summed over clients to anyone else (issue 32)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric

__all__ = ["MAX_CLIENT_SERIES", "OTHER_MODEL", "TOKEN_KINDS", "ClientCounters"]

OTHER_MODEL = "other"  # the label past a family's bound of series
MAX_CLIENT_SERIES = 4096  # label sets per client family; then the route is counted as `other`
# cached and cache_write: the parts of prompt read from / written to the provider's cache
TOKEN_KINDS = ("prompt", "completion", "cached", "cache_write")


class ClientCounters:
    """What each configured client spent (issue 24), counted once per request at its end:
    `meshroute_client_requests_total{client,route,status}`,
    `meshroute_client_tokens_total{client,route,kind}` (kind prompt|completion, and
    cached|cache_write: the parts of prompt read from / written to the provider's cache) and
    `meshroute_client_cost_usd_total{client}`. Clients are configured and routes are the
    configured provider routes and the mesh's models, so the label sets are bounded; past
    MAX_CLIENT_SERIES a new route is counted as `other` all the same."""

    __slots__ = ("cost", "requests", "tokens")

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, str], int] = {}
        self.tokens: dict[tuple[str, str, str], int] = {}
        self.cost: dict[str, float] = {}

    def count(self, client: str, route: str, status: int, prompt_tokens: int,
              completion_tokens: int, cost_usd: float, cached_tokens: int = 0,
              cache_write_tokens: int = 0) -> None:
        """One request of `client` ended with `status` on `route`."""
        route = self._route(client, route)
        key = (client, route, str(status))
        self.requests[key] = self.requests.get(key, 0) + 1
        for kind, n in zip(TOKEN_KINDS, (prompt_tokens, completion_tokens, cached_tokens,
                                         cache_write_tokens), strict=True):
            if n:
                tk = (client, route, kind)
                self.tokens[tk] = self.tokens.get(tk, 0) + n
        self.cost[client] = self.cost.get(client, 0.0) + cost_usd

    def families(self) -> Iterator[Metric]:
        """The three families, by client (for the admin and loopback: /metrics)."""
        yield from self._families(by_client=True)

    def aggregate_families(self) -> Iterator[Metric]:
        """The three families summed over clients, without the `client` label (for anyone
        else: /metrics)."""
        yield from self._families(by_client=False)

    def _families(self, by_client: bool) -> Iterator[Metric]:
        who = ["client"] if by_client else []
        requests = CounterMetricFamily("meshroute_client_requests",
                                       "Chat requests of configured clients, by route and "
                                       "status", labels=[*who, "route", "status"])
        for labels, n in _summed(self.requests, by_client).items():
            requests.add_metric(list(labels), n)
        tokens = CounterMetricFamily("meshroute_client_tokens",
                                     "Tokens configured clients spent, by route and kind "
                                     "(prompt|completion|cached|cache_write)",
                                     labels=[*who, "route", "kind"])
        for labels, n in _summed(self.tokens, by_client).items():
            tokens.add_metric(list(labels), n)
        cost = CounterMetricFamily("meshroute_client_cost_usd",
                                   "USD configured clients spent (provider prices; mesh "
                                   "routes are free)", labels=who)
        for labels, usd in _summed({(c,): v for c, v in self.cost.items()}, by_client).items():
            cost.add_metric(list(labels), usd)
        yield from (requests, tokens, cost)

    def _route(self, client: str, route: str) -> str:
        if len(self.requests) < MAX_CLIENT_SERIES or any(
                k[0] == client and k[1] == route for k in self.requests):
            return route
        return OTHER_MODEL


def _summed(table: Mapping[Any, float], by_client: bool
            ) -> dict[tuple[str, ...], float]:
    """`table` (keyed by client first) as it is, or summed over its clients."""
    if by_client:
        return dict(table)
    out: dict[tuple[str, ...], float] = {}
    for key, n in table.items():
        out[key[1:]] = out.get(key[1:], 0) + n
    return out
