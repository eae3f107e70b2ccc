"""Trackers that gossip and share no limits store learn provider routes as one (issue 23, part
3): a route failing on A ranks below its healthy peer on B before B called it; A's 429
cooldown and 401 revocation hold on B within a round, a clear supersedes them; every key's
usage is summed over origins; reports are strictly decoded; the overshoot is bounded."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import msgpack
import pytest

from gossip import errors as err
from gossip import reports_wire
from gossip.memory import MemoryNetwork
from gossip.service import GossipConfig, GossipService
from gossip.wire import MessageType, WireCodec
from meshroute_middleware.core.providers.chain import provider_candidate
from meshroute_middleware.core.providers.config import ProvidersConfig, parse_providers_config
from meshroute_middleware.core.providers.peers import Peers, PeerState, Usage
from meshroute_middleware.core.providers.router import ChainAttempt, ProviderRouter
from meshroute_middleware.core.providers.scoring import OutcomeKind
from tests.conftest import FakeClock
from tests.gossip.helpers import make_router, run_round

pytestmark = pytest.mark.anyio
T0 = 1_796_040_000.0  # noon UTC, 2026-11-30


def config(rpm: int | None = None) -> ProvidersConfig:
    limits = {} if rpm is None else {"rpm": rpm}
    return parse_providers_config({
        "routing": {"chain": ["aco/m", "bco/m"]},
        "providers": [{"name": n, "base_url": "http://127.0.0.1:9/v1", "keys": ["env:K"],
                       **limits, "models": [{"id": "m", "tier": "large"}]}
                      for n in ("aco", "bco")]})


def tracker(cfg: ProvidersConfig) -> ProviderRouter:
    router = ProviderRouter(cfg)
    router.peers = router.gates.peers = Peers()
    return router


def take(router: ProviderRouter, route: str, now: float) -> ChainAttempt | None:
    provider, model = router.cfg.split_route(route) or (None, None)
    assert provider is not None and model is not None
    got = router.acquire(provider_candidate(provider, model), 10, now)
    return got if isinstance(got, ChainAttempt) else None


def tell(a: ProviderRouter, b: ProviderRouter, now: float) -> None:
    """One exchange's worth: B takes A's report."""
    assert b.merge_peer("A", a.report(now), now)


def reason(router: ProviderRouter, route: str, now: float) -> str | None:
    provider, model = router.cfg.split_route(route) or (None, None)
    assert provider is not None and model is not None
    refusal = router.gates.check(provider, model, 1, 0, now)
    return None if refusal is None else refusal.reason


def test_a_route_failing_elsewhere_ranks_low_here_before_it_is_called() -> None:
    cfg = config()
    a, b = tracker(cfg), tracker(cfg)
    res = b.resolve("auto", ())
    assert [s.candidate.route for s in b.rank(res, T0)] == ["aco/m", "bco/m"]  # a tie
    for i in range(8):
        for route, kind in (("aco/m", OutcomeKind.FAILURE), ("bco/m", OutcomeKind.SUCCESS)):
            got = take(a, route, T0 + i)
            assert got is not None
            a.record(got, kind, T0 + i, reason="http_5xx")
    tell(a, b, T0 + 9)
    ranked = b.rank(res, T0 + 9)
    assert [s.candidate.route for s in ranked] == ["bco/m", "aco/m"]
    assert "aco/m" not in b.stats and ranked[1].reliability < 0.2  # B never called it


def test_a_cooldown_and_a_revocation_hold_elsewhere_and_a_clear_supersedes_them() -> None:
    cfg = config()
    a, b = tracker(cfg), tracker(cfg)
    a.gates.rate_limited("aco/m", 1, 30.0, T0)
    a.gates.revoke("bco", "m", 1, 401, T0)
    tell(a, b, T0 + 1)
    assert reason(b, "aco/m", T0 + 2) == "cooldown" and reason(b, "bco/m", T0 + 2) == "revoked"
    assert reason(b, "aco/m", T0 + 31) is None  # the cooldown's end, learned with it
    b.clear(None, T0 + 32)  # a clear on B supersedes what A set before it
    assert reason(b, "bco/m", T0 + 33) is None
    a.gates.rate_limited("aco/m", 1, 30.0, T0 + 40)  # set after the clear: it holds
    tell(a, b, T0 + 41)
    assert reason(b, "aco/m", T0 + 42) == "cooldown"
    b.gates.rate_limited("bco/m", 1, 60.0, T0 + 43)  # B's own, then cleared at A
    a.clear("bco/m", T0 + 44)
    tell(a, b, T0 + 45)
    assert reason(b, "bco/m", T0 + 46) is None


def test_usage_is_summed_over_origins() -> None:
    cfg = config(rpm=10)
    a, b = tracker(cfg), tracker(cfg)
    assert all(take(a, "aco/m", T0 + i * 0.1) for i in range(6))
    tell(a, b, T0 + 1)
    admitted = [take(b, "aco/m", T0 + 1 + i * 0.1) for i in range(10)]
    assert sum(x is not None for x in admitted) == 4
    assert reason(b, "aco/m", T0 + 3) == "rpm"
    assert reason(b, "aco/m", T0 + 62) is None  # A's report is over a minute old


def test_peers_keep_the_newest_report_per_origin_and_refuse_the_future() -> None:
    peers = Peers()
    assert peers.merge("A", PeerState(T0, usage={("aco", 1): Usage(3)}), T0)
    assert not peers.merge("A", PeerState(T0 - 1, usage={("aco", 1): Usage(9)}), T0)
    assert not peers.merge("A", PeerState(T0 + 3600), T0)
    assert peers.usage("aco", 1, T0).minute_requests == 3


def test_a_report_round_trips_and_hostile_ones_are_refused() -> None:
    cfg = config()
    a = tracker(cfg)
    got = take(a, "aco/m", T0)
    assert got is not None
    a.record(got, OutcomeKind.SUCCESS, T0, tokens_per_s=40.0, ttfb_ms=120.0)
    a.gates.rate_limited("bco/m", 1, 30.0, T0)
    a.gates.revoke("bco", "m", 1, 403, T0)
    a.clear("aco/m#1", T0 + 1)
    codec = WireCodec("A", b"s")
    sent = a.report(T0 + 1)
    message = WireCodec("B", b"s").decode(codec.encode(sent, T0 + 1), T0 + 1)
    assert message.kind is MessageType.PROVIDERS and message.body == sent
    bad = [{"t": T0, "c": {"bco/m": {"0": [T0, T0]}}},  # key positions start at 1
           {"t": T0, "r": {"bco/m": {"1": [500, T0]}}},  # not a revoking status
           {"t": T0, "u": {"aco": {"1": [-1, 0, 1, 0, 0]}}},  # a negative count
           {"t": T0, "s": {"aco/m": [1, 0, None, None, 99.0, T0]}},  # penalty past its cap
           {"t": T0, "c": {f"r{i}": {} for i in range(300)}},  # too many names
           {"c": {}}]  # no time
    for obj in bad:
        with pytest.raises(err.MalformedMessage):
            reports_wire.read_report(msgpack.unpackb(msgpack.packb(obj)))


@asynccontextmanager
async def two(clock: FakeClock, cfgs: ProvidersConfig) -> AsyncIterator[
        tuple[list[GossipService], list[ProviderRouter]]]:
    network, addresses = MemoryNetwork(0), [("A", 1), ("B", 1)]
    routers = [tracker(cfgs), tracker(cfgs)]
    async with AsyncExitStack() as stack:
        services = []
        for i, address in enumerate(addresses):
            gossip = GossipConfig(address, tuple(x for x in addresses if x != address),
                                  interval_s=1e6, fanout=1, secret=b"s", timeout_s=1.0)
            services.append(await stack.enter_async_context(GossipService(
                make_router(address[0], clock), gossip, transport=network.transport(address),
                rng=random.Random(i), clock=clock, providers=routers[i])))
        yield services, routers


async def test_a_cooldown_learned_by_a_is_honoured_by_b_within_a_round(
        clock: FakeClock) -> None:
    async with two(clock, config()) as (services, (a, b)):
        a.gates.rate_limited("aco/m", 1, 120.0, clock())
        assert reason(b, "aco/m", clock()) is None
        clock.advance(1.0)
        await run_round(services[0])  # A's round: B takes A's report (and A B's)
        assert reason(b, "aco/m", clock()) == "cooldown"
        b.clear(None, clock() + 0.5)
        clock.advance(1.0)
        await run_round(services[1])  # B's round: its clear reaches A
        assert reason(a, "aco/m", clock()) is None
        assert services[0].providers is a and "B" in (a.peers.states if a.peers else {})


def overshoot(rate_per_s: float, interval_s: float, limit: int = 60) -> int:
    """Two trackers, each taking `rate_per_s` requests for one key with rpm `limit`, reports
    exchanged both ways every `interval_s`: how many more than `limit` were admitted in the
    first minute."""
    cfg = config(rpm=limit)
    a, b = tracker(cfg), tracker(cfg)
    admitted, step = 0, 1.0 / rate_per_s
    next_round, t = T0 + interval_s, T0
    while t < T0 + 60:
        for router in (a, b):
            admitted += take(router, "aco/m", t) is not None
        t += step
        if t >= next_round:
            for x, y in ((a, b), (b, a)):
                y.merge_peer("x", x.report(t), t)
            next_round += interval_s
    return admitted - limit


@pytest.mark.parametrize(("rate", "interval"), [(5.0, 1.0), (20.0, 0.5), (20.0, 1.0),
                                              (20.0, 3.0)])
def test_overshoot_is_at_most_what_peers_admit_within_one_round(
        rate: float, interval: float) -> None:
    """The bound: a tracker can admit what its peer admitted since its last report, one
    gossip round of the peer's traffic (rate x interval), never more."""
    assert 0 <= overshoot(rate, interval) <= rate * interval


async def test_a_tracker_without_provider_routes_answers_an_empty_report(
        clock: FakeClock) -> None:
    async with two(clock, config()) as (services, (a, _)):
        services[1].providers = None
        clock.advance(1.0)
        assert await services[0].exchange(("B", 1))
        assert a.peers is not None and a.peers.states["B"].usage == {}
        await anyio.sleep(0)
