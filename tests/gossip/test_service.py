"""GossipService over the in-memory network: convergence under faults, refusals, backoff."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

import anyio
import pytest

from gossip import state as st
from gossip.memory import MemoryNetwork
from gossip.metrics import metric_families
from gossip.service import GossipConfig, GossipService
from gossip.wire import WireCodec
from meshroute_middleware.core.stats import StatEntry
from meshroute_middleware.core.topology import NodeRecord
from tests.conftest import FakeClock
from tests.gossip.helpers import MODEL, close, learned, make_router, record, run_round

from ..conftest import route_view

pytestmark = pytest.mark.anyio
SECRET = b"s3cret"


@asynccontextmanager
async def cluster(n: int, clock: FakeClock, network: MemoryNetwork, fanout: int = 2,
                  secret: bytes | None = SECRET) -> AsyncIterator[list[GossipService]]:
    """n trackers t0..t(n-1), each knowing all the others, rounds driven by the test."""
    addresses = [(f"t{i}", 1) for i in range(n)]
    async with AsyncExitStack() as stack:
        services = []
        for i, address in enumerate(addresses):
            config = GossipConfig(address, tuple(a for a in addresses if a != address),
                                  interval_s=1e6, fanout=fanout, secret=secret, timeout_s=1.0)
            service = GossipService(make_router(f"t{i}", clock), config,
                                    transport=network.transport(address), rng=random.Random(i))
            services.append(await stack.enter_async_context(service))
        yield services


async def rounds(services: list[GossipService], clock: FakeClock, k: int) -> None:
    """k rounds: every tracker runs one round, concurrently, one second apart."""
    for _ in range(k):
        clock.advance(1.0)
        async with anyio.create_task_group() as tg:
            for service in services:
                tg.start_soon(run_round, service)


def agree(services: list[GossipService]) -> bool:
    first = learned(services[0].router)
    return all(all(close(first[h], v) for h, v in learned(s.router).items())
               for s in services[1:])


@pytest.mark.parametrize("faults", [{}, {"drop_rate": 0.2, "duplicate_rate": 0.2}])
async def test_learned_tps_reach_every_tracker(clock: FakeClock, faults: dict[str, Any]) -> None:
    network = MemoryNetwork(5, **faults)
    async with cluster(4, clock, network) as services:
        record(services[0].router, "fast", 100.0, 5)
        record(services[0].router, "slow", 40.0, 5)
        done = 0
        while done < 10 and not agree(services):
            await rounds(services, clock, 1)
            done += 1
        assert agree(services), f"no agreement after {done} rounds"
        assert done <= (3 if not faults else 10)
        for service in services[1:]:
            table = service.router.routing_table(MODEL)["models"][MODEL]["candidates"]
            assert {row["origins"] for row in table} == {1}
            assert learned(service.router)["fast"] == pytest.approx(100.0, rel=0.01)


async def test_every_origin_counts_once_in_the_merged_view(clock: FakeClock) -> None:
    network = MemoryNetwork(2, duplicate_rate=0.5)
    async with cluster(3, clock, network) as services:
        for service, tps in zip(services, (90.0, 60.0, 30.0), strict=True):
            record(service.router, "fast", tps)
        await rounds(services, clock, 4)
        for service in services:
            view = route_view(service.router.stats, MODEL, _sig(service, "fast"), clock())
            assert view.origins == 3 and view.count == 3
            assert view.tps == pytest.approx(60.0)  # equal masses: the plain mean
        replays = sum(s.counters.rejected.get("replayed", 0) for s in services)
        assert replays == network.counters.duplicated  # every duplicate refused, none applied


def _sig(service: GossipService, head: str) -> str:
    return next(r.signature for r in service.router.candidates(MODEL) if r.head.node_id == head)


async def push(service: GossipService, codec: WireCodec, delta: st.Delta,
               now: float) -> bytes | None:
    """Push `delta` as a real initiator does: a DIGEST first, then the push answering its reply."""
    reply = await service.handle(codec.encode(st.Digest(), now), ("x", 1))
    assert reply is not None
    challenge = codec.decode(reply, now).nonce
    return await service.handle(codec.encode(delta, now, reply_to=challenge), ("x", 1))


async def test_refused_messages_are_counted_and_never_touch_the_state(clock: FakeClock) -> None:
    async with cluster(1, clock, MemoryNetwork(0)) as (service,):
        entry = {(MODEL, _sig(service, "fast"), "intruder"): StatEntry(9.0, 5.0, clock(),
                                                                        count=5)}
        delta = st.Delta(entry)
        honest = WireCodec("t9", SECRET)
        reply = await service.handle(honest.encode(st.Digest(), clock()), ("t9", 1))
        assert reply is not None
        valid = honest.encode(st.Delta({(MODEL, _sig(service, "slow"), "t9"): StatEntry(
            7.0, 1.0, clock(), count=1)}), clock(), reply_to=honest.decode(reply, clock()).nonce)
        assert await service.handle(valid, ("t9", 1)) is not None
        before = st.flat_entries(service.router.stats)
        assert set(before) == {(MODEL, _sig(service, "slow"), "t9")}
        bad = {
            "malformed": b"\x93\x01\x02",
            "unsigned": WireCodec("t9", None).encode(delta, clock()),
            "forged": WireCodec("t9", b"guess").encode(delta, clock()),
            "replayed": valid,
            "expired": honest.encode(delta, clock() - 3600),
            "oversized": b"\x00" * (2 * 1024 * 1024),
            "version": b"\x97\x01\x02\xa2t9\x00\x01\xc4\x00\xc0",  # a version 1 frame
        }
        for reason, frame in bad.items():
            assert await service.handle(frame, ("x", 1)) is None, reason
        assert await service.handle(honest.encode(delta, clock()), ("x", 1)) is None
        assert st.flat_entries(service.router.stats) == before
        assert service.counters.rejected == {**{reason: 1 for reason in bad}, "replayed": 2}


async def test_a_peer_using_our_origin_is_refused(clock: FakeClock) -> None:
    async with cluster(1, clock, MemoryNetwork(0)) as (service,):
        twin = WireCodec("t0", SECRET)
        service.router.stats.record_sample(MODEL, _sig(service, "fast"), 50.0, 0.1, clock())
        reply = await service.handle(twin.encode(st.Digest(), clock()), ("x", 1))
        assert reply is not None  # an empty delta, so the twin learns and drops us
        assert twin.decode(reply, clock()).body == st.Delta()
        assert service.counters.rejected == {"same_origin": 1}


async def test_a_dead_peer_backs_off_and_never_blocks_a_round(clock: FakeClock) -> None:
    network = MemoryNetwork(0)
    config = GossipConfig(("a", 1), (("t0", 1), ("dead", 1)), interval_s=1e6, fanout=2,
                          secret=SECRET, timeout_s=1.0)
    async with cluster(1, clock, network) as _, GossipService(
            make_router("a", clock), config, transport=network.transport(("a", 1)),
            rng=random.Random(0)) as lonely:
        await run_round(lonely)
        assert (lonely.counters.exchanges, lonely.counters.exchange_failures) == (2, 1)
        assert lonely.counters.rejected == {"unreachable": 1}
        clock.advance(0.5)
        assert lonely.membership.pick(2, clock(), lonely.rng) == [("t0", 1)]
        clock.advance(1.0)
        assert len(lonely.membership.pick(2, clock(), lonely.rng)) == 2


async def test_partition_then_heal(clock: FakeClock) -> None:
    network = MemoryNetwork(9)
    async with cluster(4, clock, network, fanout=1) as services:
        network.partition([("t0", 1), ("t1", 1)], [("t2", 1), ("t3", 1)])
        record(services[0].router, "fast", 80.0)
        record(services[2].router, "slow", 30.0)
        await rounds(services, clock, 5)
        assert learned(services[1].router) == {"fast": pytest.approx(80.0), "slow": None}
        assert learned(services[3].router) == {"fast": None, "slow": pytest.approx(30.0)}
        network.heal()
        for s in services:  # backoff from the partition would otherwise delay the check
            for peer in s.membership.peers():
                s.membership.mark_ok(peer)
        await rounds(services, clock, 6)
        assert agree(services)
        assert learned(services[1].router) == {"fast": pytest.approx(80.0),
                                               "slow": pytest.approx(30.0)}


async def test_a_topology_change_elsewhere_makes_statistics_stale(clock: FakeClock) -> None:
    async with cluster(2, clock, MemoryNetwork(0)) as services:
        record(services[0].router, "fast", 50.0)
        clock.advance(5)
        services[1].router.upsert_node(NodeRecord("new", MODEL, 0, 9, 10, "http://127.0.0.1:9/c"))
        await rounds(services, clock, 1)
        topo = services[0].router.topology.model(MODEL)
        assert topo is not None and topo.changed_at == clock() - 1.0
        table = services[0].router.routing_table(MODEL)["models"][MODEL]["candidates"]
        assert {r["head"]: r["status"] for r in table}["fast"] == "stale"


async def test_exchanges_show_in_the_exported_metrics(clock: FakeClock) -> None:
    async with cluster(2, clock, MemoryNetwork(0)) as services:
        await rounds(services, clock, 1)
        samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
                   for family in metric_families(services[0]) for s in family.samples}
        assert samples[("meshroute_gossip_rounds_total", ())] == 1
        assert samples[("meshroute_gossip_peers", ())] == 1
        assert samples[("meshroute_gossip_messages_total", (("direction", "sent"),))] >= 1
        assert samples[("meshroute_gossip_bytes_total", (("direction", "sent"),))] > 0


async def test_a_hanging_peer_never_delays_the_next_round(clock: FakeClock) -> None:
    network = MemoryNetwork(0)

    async def hang(payload: bytes, sender: tuple[str, int]) -> bytes | None:
        await anyio.sleep(60)
        return None

    config = GossipConfig(("a", 1), (("t0", 1), ("hang", 1)), interval_s=0.02, fanout=2,
                          secret=SECRET, timeout_s=5.0)
    async with anyio.create_task_group() as tg:
        await tg.start(network.transport(("hang", 1)).serve, hang)
        async with cluster(1, clock, network) as (live,), GossipService(
                make_router("a", clock), config, transport=network.transport(("a", 1)),
                rng=random.Random(0)) as service:
            await anyio.sleep(0.3)  # ~15 intervals, far less than the 5 s timeout
            assert service.counters.rounds >= 5
            assert live.counters.messages_received >= 5  # the live peer kept being gossiped
            assert service.counters.exchanges == live.counters.messages_received + 1
            assert ("hang", 1) in service._busy  # one exchange open, never a second one
        tg.cancel_scope.cancel()


async def test_gossiping_with_ourselves_drops_that_peer(clock: FakeClock) -> None:
    network = MemoryNetwork(0)
    async with cluster(1, clock, network) as (service,):
        assert service.add_peer("t0-alias", 1) and not service.add_peer("t0-alias", 1)
        network._handlers[("t0-alias", 1)] = service.handle  # our own address under a 2nd name
        await run_round(service)
        assert service.membership.peers() == []
        assert service.counters.rejected == {"same_origin": 2}  # refused inbound and outbound
        assert not service.remove_peer("t0-alias", 1)


async def test_refusals_are_logged_at_most_once_a_minute_per_reason(
        clock: FakeClock, caplog: pytest.LogCaptureFixture) -> None:
    async with cluster(1, clock, MemoryNetwork(0)) as (service,):
        stranger = WireCodec("t9", None)  # unsigned: refused, the service holds a secret
        for _ in range(50):
            assert await service.handle(stranger.encode(st.Digest(), clock()), ("x", 1)) is None
        clock.advance(61.0)
        assert await service.handle(stranger.encode(st.Digest(), clock()), ("x", 1)) is None
    lines = [r.getMessage() for r in caplog.records if "refused a message" in r.getMessage()]
    assert service.counters.rejected == {"unsigned": 51}
    assert len(lines) == 2 and "(49 more like it not logged)" in lines[1]
