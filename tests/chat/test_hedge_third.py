"""A hedge on a third route (issue 34): when the hedge has no first byte by its own delay
either, the route after it starts too, up to core/hedging.MAX_RACERS routes racing; every
hedge is counted (`meshroute_hedges_total{outcome}`), capped and reserved against its
client's limits, and every loser's connection is closed. Virtual clock
(tests/chat/virtual_time.py): no wall-clock bound."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from meshroute_middleware.app.gateway import Gateway, build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.chat.attempts import Exchange
from meshroute_middleware.chat.hedge import Hedging, Release, _free, client_reserve
from meshroute_middleware.chat.spend import ClientSpend
from meshroute_middleware.core import RouterConfig, parse_node
from meshroute_middleware.core.clients import CLIENT_STATE, Client
from meshroute_middleware.core.hedging import MAX_RACERS, HedgeAfter, HedgePlan
from meshroute_middleware.middleware import MeshRouteMiddleware, MiddlewareConfig
from meshroute_middleware.state.limits import MemoryLimits

from ..conftest import FakeClock
from .test_deadlines_keys import Provider
from .test_deadlines_keys import _client as chain_client
from .test_deadlines_keys import _gateway as keys_gateway
from .test_deadlines_keys import _post as post_chain
from .test_hedge import SSE, T0, SlowTail, _first_bytes, _nothing, _statuses, node
from .virtual_time import run_virtual

NAMES = ("one", "two", "three", "four")
# the cap's credit starts empty and holds 2 hedges at most (core/hedging.py BURST): the
# first request, fast, fills it (max_share 1.0), so the second may hedge twice


def _gateway(upstream: SlowTail, routes: int) -> Gateway:
    settings = replace(ServeSettings(), mdns=False, seed=7, hedge_after="40ms",
                       hedge_max_share=1.0, router=RouterConfig(explore_share=0.0))
    gateway = build_gateway(settings, forwarder=upstream, clock=FakeClock())
    for n, name in enumerate(NAMES[:routes], 1):
        gateway.mesh.upsert_raw(node(name, n, tps=60 - 5 * n), "test")
    return gateway


def test_a_hedge_without_its_first_byte_gets_a_third_route() -> None:
    upstream = SlowTail(slow=frozenset({2, 3}))  # the second's route and its hedge: 2 s
    gateway = _gateway(upstream, 3)
    took = run_virtual(lambda: _first_bytes(gateway, 2))
    assert took[1] < 0.2, took  # 40 + 40 ms of hedge delays, then 20 ms: not 2 s
    assert upstream.opened == 4 and upstream.cancelled == 2  # both losers closed
    assert gateway.hedging is not None
    assert gateway.hedging.counts == {"won": 1, "lost": 1}  # per hedge: the third won
    assert gateway.hedging.cap.hedges == 2
    text = gateway.telemetry.render().decode()
    assert 'meshroute_hedges_total{outcome="won"} 1.0' in text
    assert 'meshroute_hedges_total{outcome="lost"} 1.0' in text


def test_no_more_than_max_racers_routes_race() -> None:
    upstream = SlowTail(slow=frozenset({2, 3, 4, 5}))  # every route slow for the second
    gateway = _gateway(upstream, 4)
    took = run_virtual(lambda: _first_bytes(gateway, 2))
    assert MAX_RACERS == 3 and upstream.opened == 1 + MAX_RACERS  # no fourth route started
    assert 2.0 <= took[1] < 2.2  # the first racer's 2 s answer wins
    assert upstream.cancelled == 2
    assert gateway.hedging is not None and gateway.hedging.counts == {"won": 0, "lost": 2}


def test_a_hedge_answering_in_time_starts_no_third() -> None:
    upstream = SlowTail(slow=frozenset({2}))
    gateway = _gateway(upstream, 3)
    run_virtual(lambda: _first_bytes(gateway, 2))
    assert upstream.opened == 3 and upstream.cancelled == 1
    assert gateway.hedging is not None and gateway.hedging.counts == {"won": 1, "lost": 0}


BOB = Client("bob", hashlib.sha256(b"bob").digest(), rpm=4)


def _bob_app(spend: ClientSpend, upstream: SlowTail) -> ASGIApp:
    hedging = Hedging(HedgePlan(HedgeAfter(fixed_s=0.04), max_share=1.0),
                      client_reserve(spend))
    app = MeshRouteMiddleware(_nothing, MiddlewareConfig(), forwarder=upstream, spend=spend,
                              hedging=hedging)
    for n, name in enumerate(NAMES[:3], 1):
        app.router.upsert_node(parse_node(node(name, n, tps=60 - 5 * n)))

    async def as_bob(scope: Scope, receive: Receive, send: Send) -> None:
        scope.setdefault("state", {})[CLIENT_STATE] = BOB
        await app(scope, receive, send)
    return as_bob


def test_each_hedge_is_reserved_against_the_clients_rpm_and_each_loser_charged() -> None:
    spend = ClientSpend(MemoryLimits(), clock=FakeClock(T0))
    upstream = SlowTail(slow=frozenset({2, 3}))

    async def main() -> tuple[list[int], list[dict[str, Any]]]:
        statuses = await _statuses(_bob_app(spend, upstream), 3)
        return statuses, await spend.usage_rows()

    statuses, rows = run_virtual(main)
    # rpm = 4: the first request, the second and its two hedges; the third is refused
    assert statuses == [200, 200, 429]
    assert upstream.opened == 4 and upstream.cancelled == 2
    [row] = rows
    assert (row["route"], row["requests"], row["errors"]) == ("m", 4, 2)
    assert spend.counters.requests[("bob", "m", "499")] == 2



def test_a_chain_hedges_on_its_third_route_too() -> None:
    provider = Provider(slow=frozenset({2, 3}))  # the second request's route and hedge
    gateway = keys_gateway(provider, ("fastco/big", "fastco/other", "fastco/third"),
                           hedge_after="100ms", hedge_max_share=1.0)

    async def main() -> list[tuple[int, float]]:
        async with chain_client(gateway) as client:
            return [await post_chain(client) for _ in range(2)]

    answers = run_virtual(main)
    assert [status for status, _ in answers] == [200, 200]
    assert answers[1][1] < 0.3  # 100 + 100 ms of hedge delays, then 20 ms: not 2 s
    assert provider.opened == 4 and provider.cut == 2  # both losers cancelled
    assert gateway.hedging is not None and gateway.hedging.counts == {"won": 1, "lost": 1}


@dataclass
class _Long:
    """A head answering its first byte after `head_s` (request 2: `late_s`), then a stream
    of 4 chunks 50 ms apart."""

    head_s: float = 0.02
    late_s: float = 0.06
    opened: int = 0

    async def open(self, url: str, body: bytes,
                   headers: Iterable[tuple[bytes, bytes]]) -> _LongAnswer:
        self.opened += 1
        await asyncio.sleep(self.late_s if self.opened == 2 else self.head_s)
        return _LongAnswer()

    async def aclose(self) -> None:
        pass


@dataclass
class _LongAnswer:
    status: int = 200
    headers: list[tuple[bytes, bytes]] = field(default_factory=lambda: list(SSE))

    async def chunks(self) -> AsyncIterator[bytes]:
        for i in range(4):
            if i:
                await asyncio.sleep(0.05)
            yield b'data: {"choices":[{"delta":{"content":"w' + str(i).encode() + b'"}}]}\n\n'
        yield b"data: [DONE]\n\n"

    def close(self) -> None:
        pass


def test_no_hedge_starts_once_the_race_was_decided_during_its_admission() -> None:
    """The hedge's admission waits on the limits' store (here 50 ms, from 40 ms on); the
    first route's byte came meanwhile (60 ms) and its answer still streams: no hedge is
    sent, nothing counted, nothing left in flight."""
    upstream = _Long()

    async def slow_reserve(ex: Exchange, chain: bool) -> Release | None:
        await asyncio.sleep(0.05)
        return _free

    hedging = Hedging(HedgePlan(HedgeAfter(fixed_s=0.04), max_share=1.0), slow_reserve)
    app = MeshRouteMiddleware(_nothing, MiddlewareConfig(), forwarder=upstream,
                              hedging=hedging)
    for n, name in enumerate(NAMES[:3], 1):
        app.router.upsert_node(parse_node(node(name, n, tps=60 - 5 * n)))

    assert run_virtual(lambda: _statuses(app, 2)) == [200, 200]
    assert upstream.opened == 2
    assert hedging.counts == {"won": 0, "lost": 0} and hedging.cap.hedges == 0
    assert all(r["in_flight"] == 0
               for r in app.router.routing_table()["models"]["m"]["candidates"])
