"""Provider reports are relayed (issue 23, part 3): with trackers in a line A-B-C and no A-C
link, C honours A's cooldown, sums usage over all three origins and learns revocations and
clears; duplicated, reordered and replayed reports change nothing, a forged report for our own
origin is refused, oversized input is refused and counted, and the per-origin merge is
idempotent, commutative and associative."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from gossip import checks, reports_wire
from gossip import errors as err
from gossip.memory import MemoryNetwork
from gossip.reports_wire import Reports
from gossip.service import LEGACY_RETRY_S, GossipConfig, GossipService
from gossip.transport import Address
from gossip.wire import MessageType, WireCodec
from meshroute_middleware.core.providers.peers import (
    FUTURE,
    MAX_ORIGINS,
    NOT_RELAYED,
    OWN_ORIGIN,
    REPORT_TTL_S,
    STORE_FULL,
    Peers,
    PeerState,
    Usage,
)
from meshroute_middleware.core.providers.router import ProviderRouter
from tests.conftest import FakeClock
from tests.gossip.helpers import make_router, run_round
from tests.gossip.test_providers import config, reason, take, tracker

pytestmark = pytest.mark.anyio
LINE = {"A": ("B",), "B": ("A", "C"), "C": ("B",)}  # no A-C link


@asynccontextmanager
async def line(clock: FakeClock, rpm: int | None = None, secret: bytes | None = b"s",
               network: MemoryNetwork | None = None) -> AsyncIterator[
        tuple[dict[str, GossipService], dict[str, ProviderRouter]]]:
    """Three trackers A-B-C on the in-memory transport; A and C never exchange."""
    network = network or MemoryNetwork(0)
    routers = {name: tracker(config(rpm)) for name in LINE}
    async with AsyncExitStack() as stack:
        services = {}
        for i, (name, peers) in enumerate(LINE.items()):
            gossip = GossipConfig((name, 1), tuple((p, 1) for p in peers), interval_s=1e6,
                                  fanout=2, secret=secret, timeout_s=1.0)
            services[name] = await stack.enter_async_context(GossipService(
                make_router(name, clock), gossip, transport=network.transport((name, 1)),
                rng=random.Random(i), clock=clock, providers=routers[name]))
        yield services, routers


async def rounds(services: dict[str, GossipService], clock: FakeClock, n: int) -> None:
    """`n` gossip rounds, every tracker starting one exchange with each of its peers."""
    for _ in range(n):
        clock.advance(1.0)
        for service in services.values():
            await run_round(service)


async def test_a_cooldown_learned_by_a_is_honoured_by_c_which_never_talks_to_a(
        clock: FakeClock) -> None:
    async with line(clock) as (services, r):
        r["A"].gates.rate_limited("aco/m", 1, 120.0, clock())
        await rounds(services, clock, 2)
        assert reason(r["C"], "aco/m", clock()) == "cooldown"
        assert "A" in (r["C"].peers.states if r["C"].peers else {})
        assert services["A"].counters.entries_refused == {}


async def test_without_relay_c_would_not_hear_a(clock: FakeClock) -> None:
    """What fails on the old code: without a secret nothing is relayed, as for mesh entries."""
    async with line(clock, secret=None) as (services, r):
        r["A"].gates.rate_limited("aco/m", 1, 120.0, clock())
        await rounds(services, clock, 3)
        assert reason(r["B"], "aco/m", clock()) == "cooldown"  # B talks to A
        assert reason(r["C"], "aco/m", clock()) is None
        assert "A" not in (r["C"].peers.states if r["C"].peers else {})


async def test_usage_is_summed_over_all_three_origins(clock: FakeClock) -> None:
    async with line(clock, rpm=10) as (services, r):
        for name in ("A", "B"):
            assert all(take(r[name], "aco/m", clock()) for _ in range(3))
        await rounds(services, clock, 2)
        admitted = [take(r["C"], "aco/m", clock()) for _ in range(10)]
        assert sum(x is not None for x in admitted) == 4  # 10 - A's 3 - B's 3
        await rounds(services, clock, 2)
        assert reason(r["A"], "aco/m", clock()) == "rpm"  # A counts C's 4 and B's 3 too


async def test_a_revocation_and_a_clear_are_relayed(clock: FakeClock) -> None:
    async with line(clock) as (services, r):
        r["A"].gates.revoke("bco", "m", 1, 401, clock())
        await rounds(services, clock, 2)
        assert reason(r["C"], "bco/m", clock()) == "revoked"
        r["C"].clear(None, clock())
        await rounds(services, clock, 2)
        assert reason(r["A"], "bco/m", clock()) is None  # C's clear reached A through B
        assert reason(r["B"], "bco/m", clock()) is None


async def test_a_departed_origin_ages_out(clock: FakeClock) -> None:
    network = MemoryNetwork(0)
    async with line(clock, rpm=10, network=network) as (services, r):
        assert all(take(r["A"], "aco/m", clock()) for _ in range(5))
        r["A"].gates.revoke("bco", "m", 1, 401, clock())
        await rounds(services, clock, 2)
        assert reason(r["C"], "bco/m", clock()) == "revoked"
        network.partition([("B", 1), ("C", 1)])  # A leaves; B and C go on gossiping
        clock.advance(REPORT_TTL_S)
        await rounds({k: services[k] for k in ("B", "C")}, clock, 1)
        assert "A" not in (r["B"].peers.states if r["B"].peers else {})
        assert "A" not in (r["C"].peers.states if r["C"].peers else {})
        assert reason(r["C"], "bco/m", clock()) is None


async def test_a_duplicating_network_changes_nothing(clock: FakeClock) -> None:
    network = MemoryNetwork(3, duplicate_rate=1.0)  # every request delivered twice
    async with line(clock, rpm=10, network=network) as (services, r):
        assert all(take(r["A"], "aco/m", clock()) for _ in range(3))
        await rounds(services, clock, 3)
        assert network.counters.duplicated > 0
        assert r["C"].peers is not None
        assert r["C"].peers.usage("aco", 1, clock()).minute_requests == 3  # not 6


def report(t: float, n: int = 1) -> PeerState:
    return PeerState(t, usage={("aco", 1): Usage(n)})


def test_replayed_and_reordered_reports_change_nothing() -> None:
    now = 1_000_000.0
    newest = {"A": report(now, 3), "B": report(now - 1, 2)}
    peers = Peers()
    assert peers.merge_all(newest, now, sender="B", own="C", relay=True).applied == 2
    held = dict(peers.states)
    older = {"A": report(now - 5, 9), "B": report(now - 6, 9)}
    for batch in (older, newest, {"B": newest["B"], "A": newest["A"]}):  # stale, replay, order
        merged = peers.merge_all(batch, now, sender="B", own="C", relay=True)
        assert merged.applied == 0 and merged.ignored == 2
    assert peers.states == held and peers.usage("aco", 1, now).minute_requests == 5


def test_a_report_for_our_own_origin_or_unrelayable_is_refused() -> None:
    now = 1_000_000.0
    peers = Peers()
    merged = peers.merge_all({"C": report(now, 99), "A": report(now)}, now, sender="B",
                             own="C", relay=False)
    assert merged.refused == {OWN_ORIGIN: 1, NOT_RELAYED: 1} and peers.states == {}


async def test_a_forged_report_for_our_origin_is_refused_and_counted(clock: FakeClock) -> None:
    async with line(clock) as (services, r):
        forged = Reports({"C": PeerState(clock(), cooldowns={("aco/m", 1): (clock() + 99,
                                                                           clock())})})
        frame = WireCodec("B", b"s").encode(forged, clock())
        answer = await services["C"].handle(frame, ("B", 1))
        assert answer is not None
        assert services["C"].counters.entries_refused == {OWN_ORIGIN: 1}
        assert "C" not in (r["C"].peers.states if r["C"].peers else {})
        reply = WireCodec("B", b"s").decode(answer, clock())
        assert reply.kind is MessageType.PROVIDER_REPORTS and isinstance(reply.body, Reports)
        assert set(reply.body.by_origin) == {"C"}  # C's own, the one it speaks for


async def test_hostile_report_messages_are_refused_and_counted(clock: FakeClock) -> None:
    async with line(clock) as (services, _):
        c = services["C"]
        codec = WireCodec("B", b"s")
        many = Reports({f"o{i}": PeerState(clock())
                        for i in range(reports_wire.MAX_REPORT_ORIGINS + 1)})
        big = Reports({f"o{i}": PeerState(clock(), usage={("aco", k): Usage()
                                                         for k in range(1, 1001)})
                       for i in range(reports_wire.MAX_REPORT_ITEMS // 1000 + 1)})
        for hostile in (many, big):
            assert await c.handle(codec.encode(hostile, clock()), ("B", 1)) is None
        assert c.counters.rejected.get("oversized") == 2
        assert c.providers is not None and not c.providers.relayed(clock())


def test_a_bad_report_is_dropped_alone_and_another_version_refused_whole() -> None:
    now = 1_000_000.0
    good = reports_wire.report_obj(report(now))
    bad = {"t": now, "c": {"x": {"0": []}}}
    message = reports_wire.read_reports({"v": 1, "o": {"A": good, "B": bad}},
                                        refused := checks.Refused())
    assert set(message.by_origin) == {"A"} and refused.n == 1
    with pytest.raises(err.UnsupportedVersion):
        reports_wire.read_reports({"v": 2, "o": {"A": good}}, checks.Refused())
    codec = WireCodec("A", b"s")
    sent = reports_wire.bounded_reports("A", report(now), {"B": report(now - 1, 4)})
    assert codec.decode(codec.encode(sent, now), now).body == sent


def test_the_sender_keeps_within_the_caps() -> None:
    now = 1_000_000.0
    others = {f"o{i}": report(now - i) for i in range(200)}
    sent = reports_wire.bounded_reports("me", report(now), others)
    assert len(sent.by_origin) == reports_wire.MAX_REPORT_ORIGINS and "me" in sent.by_origin
    assert "o0" in sent.by_origin and "o199" not in sent.by_origin  # the newest go first


async def test_a_peer_that_predates_provider_reports_is_sent_its_own_type(
        clock: FakeClock) -> None:
    network = MemoryNetwork(0)
    async with line(clock, network=network) as (services, r):
        handler = services["B"].handle

        async def old(data: bytes, sender: Address) -> bytes | None:
            """An old B: its decoder knows no type 5 (unknown_type, no reply)."""
            if checks.unpack(data)[1] == MessageType.PROVIDER_REPORTS:
                return None
            return await handler(data, sender)

        network._handlers[("B", 1)] = old
        r["B"].gates.rate_limited("aco/m", 1, 120.0, clock())
        clock.advance(1.0)
        assert await services["A"].exchange(("B", 1))  # refused, counted, PROVIDERS at once
        assert services["A"].counters.rejected.get("unreachable") == 1
        assert reason(r["A"], "aco/m", clock()) == "cooldown"
        clock.advance(1.0)
        assert await services["A"].exchange(("B", 1))  # not asked again for a while
        assert services["A"].counters.rejected.get("unreachable") == 1
        clock.advance(LEGACY_RETRY_S)
        assert await services["A"].exchange(("B", 1))  # asked again, then PROVIDERS again
        assert services["A"].counters.rejected.get("unreachable") == 2


reports = hs.dictionaries(
    hs.sampled_from(["A", "B", "D", "E"]),
    hs.builds(lambda t, n, c: PeerState(float(t), usage={("aco", 1): Usage(n)},
                                        clears={("aco/m", 1): float(c)} if c else {}),
              hs.integers(0, 5), hs.integers(0, 3), hs.integers(0, 5)),
    max_size=4)


def joined(*batches: dict[str, PeerState]) -> Peers:
    peers = Peers(ttl_s=1e9)
    for batch in batches:
        peers.merge_all(batch, 10.0, sender="x", own="C", relay=True)
    return peers


def same(a: Peers, b: Peers) -> bool:
    return a.states == b.states and a.clears() == b.clears()


@settings(max_examples=200, deadline=None)
@given(reports, reports, reports)
def test_the_merge_is_idempotent_commutative_and_associative(
        x: dict[str, PeerState], y: dict[str, PeerState], z: dict[str, PeerState]) -> None:
    assert same(joined(x, x), joined(x))
    assert same(joined(x, y), joined(y, x))
    assert same(joined(x, y, z), joined(z, x, y))
    assert joined(joined(x, y).states, z).states == joined(x, joined(y, z).states).states


def line_overshoot(rate_per_s: float, interval_s: float, n: int, limit: int = 60) -> int:
    """`n` trackers in a line, each taking `rate_per_s` requests for one key with rpm `limit`;
    every `interval_s` each link swaps reports both ways, the links in order from the far end
    to the near one (a report crosses one link per round, the slowest case): how many more
    than `limit` were admitted in the first minute."""
    cfg = config(rpm=limit)
    names = [f"t{i}" for i in range(n)]
    routers = {name: tracker(cfg) for name in names}
    links = [(names[i], names[i + 1]) for i in range(n - 1)][::-1]
    admitted, step, t0 = 0, 1.0 / rate_per_s, 1_796_040_000.0
    next_round, t = t0 + interval_s, t0
    while t < t0 + 60:
        for router in routers.values():
            admitted += take(router, "aco/m", t) is not None
        t += step
        if t >= next_round:
            for x, y in links:
                for src, dst in ((x, y), (y, x)):
                    sent = {src: routers[src].report(t), **routers[src].relayed(t)}
                    routers[dst].merge_reports(src, sent, t, own=dst, relay=True)
            next_round += interval_s
    return admitted - limit


@pytest.mark.parametrize(("rate", "interval", "n"), [(5.0, 1.0, 3), (20.0, 0.5, 3),
                                                   (20.0, 1.0, 3), (5.0, 1.0, 4)])
def test_overshoot_over_a_line_is_bounded_by_the_rounds_a_report_takes(
        rate: float, interval: float, n: int) -> None:
    """A report reaches a tracker d hops away within d rounds, so the overshoot is at most
    every tracker's traffic for as many rounds as it is hops from the farthest one."""
    hops = sum(max(i, n - 1 - i) for i in range(n))
    assert 0 <= line_overshoot(rate, interval, n) <= rate * interval * hops


def test_a_full_store_and_future_reports_are_refused_and_counted() -> None:
    now = 1_000_000.0
    peers = Peers()
    many = {f"o{i}": report(now) for i in range(MAX_ORIGINS + 3)}
    merged = peers.merge_all(many, now, sender="o0", own="C", relay=True)
    assert merged.applied == MAX_ORIGINS and merged.refused == {STORE_FULL: 3}
    merged = peers.merge_all({"o0": report(now + 3600)}, now, sender="o0", own="C")
    assert merged.refused == {FUTURE: 1} and peers.states["o0"].t == now


@pytest.mark.parametrize("moved", [
    {"²": ["fastco/m", 1, 0.0, 10, 300.0]},  # a Unicode digit: isdigit(), but no int()
    {"7": ["fastco/m", 1, 1e300, 10, 300.0]},  # served after the report was made
])
def test_a_hostile_moved_conversation_is_a_malformed_report(moved: dict[str, object]) -> None:
    """A peer's moved-conversation entry is checked like every leaf: a key int() cannot read
    or a time after the report's own is refused as malformed (not a ValueError that stops
    the exchange, nor a conversation pinned to the peer's choice for ever)."""
    with pytest.raises(err.MalformedMessage):
        reports_wire.read_report({"t": 1.0, "a": moved})
