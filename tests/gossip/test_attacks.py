"""The gossip attacks of issue 11, each replayed against the landed defences.

Every test here failed on the code before the fix (noted per test) and must keep failing if the
defence it names is removed. The attacker speaks the real protocol through the public WireCodec:
a DIGEST first, then the push answering the receiver's reply, as an honest initiator does.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import msgpack
import pytest

from gossip import state as st
from gossip.memory import MemoryNetwork
from gossip.metrics import metric_families
from gossip.service import GossipConfig, GossipService
from gossip.transport import HANDSHAKE_TIMEOUT_S, TcpTransport
from gossip.wire import WireCodec
from meshroute_middleware.core.stats import StatEntry
from tests.conftest import FakeClock
from tests.gossip.helpers import MODEL, learned, make_router, record, run_round

pytestmark = pytest.mark.anyio
SECRET = b"mesh secret"


@asynccontextmanager
async def trackers(clock: FakeClock, network: MemoryNetwork, n: int = 2,
                   secret: bytes | None = None) -> AsyncIterator[list[GossipService]]:
    """n trackers t0..t(n-1) knowing each other; rounds run only when the test asks."""
    addresses = [(f"t{i}", 1) for i in range(n)]
    async with AsyncExitStack() as stack:
        services = []
        for i, address in enumerate(addresses):
            config = GossipConfig(address, tuple(a for a in addresses if a != address),
                                  interval_s=1e6, fanout=n, secret=secret, timeout_s=1.0)
            services.append(await stack.enter_async_context(GossipService(
                make_router(f"t{i}", clock), config, transport=network.transport(address),
                rng=random.Random(i))))
        yield services


async def rounds(services: list[GossipService], clock: FakeClock, k: int) -> None:
    for _ in range(k):
        clock.advance(1.0)
        for service in services:
            await run_round(service)


def sig(service: GossipService, head: str) -> str:
    return next(r.signature for r in service.router.candidates(MODEL) if r.head.node_id == head)


async def push(service: GossipService, codec: WireCodec, delta: st.Delta, now: float) -> None:
    """Push `delta` the way a real initiator does; the outcome shows only in the counters."""
    reply = await service.handle(codec.encode(st.Digest(), now), ("attacker", 1))
    assert reply is not None  # a digest from anyone gets an answer
    nonce = msgpack.unpackb(reply)[4]  # the reply's header nonce; its big body need not be read
    frame = codec.encode(delta, now, reply_to=nonce)
    await service.handle(frame, ("attacker", 1))


def entries_refused(service: GossipService) -> dict[str, float]:
    """The exported per-reason refusal counter, read from the Prometheus families."""
    return {s.labels["reason"]: s.value for family in metric_families(service)
            for s in family.samples if s.name == "meshroute_gossip_entries_refused_total"}


async def test_a_stranger_cannot_steer_routing_nor_spread_it(clock: FakeClock) -> None:
    """Before: one frame (another tracker's origin, mass 1e9, now + 299 s) moved 30 of 30
    requests to the route it favoured and spread onward."""
    async with trackers(clock, MemoryNetwork(0), n=3) as (t0, t1, t2):
        record(t0.router, "fast", 100.0, 5)
        record(t0.router, "slow", 40.0, 5)
        await rounds([t0, t1, t2], clock, 2)
        honest = {t.origin: learned(t.router) for t in (t0, t1, t2)}
        assert honest["t1"] == honest["t0"]  # direct gossip still converges without a secret
        lie = StatEntry(1e6, 1e9, clock() + 299, 0.001, 1e9, 0.0, 10**9, "")
        favoured = {(MODEL, sig(t1, "slow"), "t0"): lie}
        # a stranger relaying t0's "statistics", then one claiming to be t0 itself
        await push(t1, WireCodec("stranger"), st.Delta(favoured), clock())
        await push(t1, WireCodec("t0"), st.Delta(favoured), clock())
        assert learned(t1.router) == honest["t1"]
        picks = [t1.router.choose(MODEL).route.head.node_id for _ in range(30)]
        assert picks.count("slow") < 30
        await rounds([t0, t1, t2], clock, 3)
        assert all(learned(t.router) == honest[t.origin] for t in (t0, t1, t2))
        assert entries_refused(t1) == {"foreign_origin": 1, "future": 1}
        for t in (t0, t1, t2):
            assert all(e.t <= clock() for _, origins in t.router.stats for e in origins.values())


async def test_a_future_change_time_does_not_freeze_learning(clock: FakeClock) -> None:
    """Before: a change time of now + 299 s was adopted; every sample for ~300 s was reset."""
    async with trackers(clock, MemoryNetwork(0), n=1) as (t0,):
        record(t0.router, "fast", 100.0, 3)
        clock.advance(10.0)  # what was measured before the (clamped) change goes stale
        peer = WireCodec("t9")
        await push(t0, peer, st.Delta(changes={MODEL: clock() + 299}), clock())
        await push(t0, peer, st.Delta(changes={MODEL: clock() + 20}), clock())  # within skew
        topo = t0.router.topology.model(MODEL)
        assert topo is not None and topo.changed_at == clock()  # clamped to our clock
        clock.advance(1.0)
        record(t0.router, "fast", 50.0, 2)
        table = t0.router.routing_table(MODEL)["models"][MODEL]["candidates"]
        fast = next(row for row in table if row["head"] == "fast")
        assert fast["status"] == "proven" and fast["tps"] == pytest.approx(50.0, rel=0.02)
        assert entries_refused(t0) == {"future_change": 1}


async def test_a_replay_after_the_receivers_restart_is_refused(clock: FakeClock) -> None:
    """Before: the replay guard lived in memory; a restarted tracker took a recorded push."""
    network = MemoryNetwork(0)
    peer = WireCodec("t9", SECRET)
    config = GossipConfig(("t0", 1), (), interval_s=1e6, secret=SECRET)
    async with GossipService(make_router("t0", clock), config,
                             transport=network.transport(("t0", 1))) as before:
        reply = await before.handle(peer.encode(st.Digest(), clock()), ("t9", 1))
        assert reply is not None
        entry = StatEntry(1e5, 1e3, clock(), 0.01, 1e3, 0.0, 1000, "")
        recorded = peer.encode(st.Delta({(MODEL, sig(before, "slow"), "t9"): entry}), clock(),
                               reply_to=peer.decode(reply, clock()).nonce)
        assert await before.handle(recorded, ("t9", 1)) is not None  # the genuine push
    clock.advance(5.0)  # restarted well within the 30 s replay window
    async with GossipService(make_router("t0", clock), config,
                             transport=network.transport(("t0", 1))) as after:
        assert await after.handle(recorded, ("attacker", 1)) is None
        assert after.counters.rejected == {"replayed": 1}
        assert st.flat_entries(after.router.stats) == {}


async def test_one_bad_entry_is_refused_alone_and_never_sent(clock: FakeClock) -> None:
    """Before: a tracker holding tps 2e302 sent it; peers refused every frame from it."""
    async with trackers(clock, MemoryNetwork(0), n=2, secret=SECRET) as (t0, t1):
        record(t0.router, "fast", 100.0, 2)
        t0.router.stats.record_sample(MODEL, sig(t0, "slow"), 2e302, 0.1, clock())
        await rounds([t0, t1], clock, 2)
        assert learned(t1.router)["fast"] == pytest.approx(100.0)
        assert learned(t1.router)["slow"] is None  # never put on the wire
        assert t0.counters.rejected == t1.counters.rejected == {}
        # a peer that does send one: that entry alone is refused, counted, the rest applied
        good = StatEntry(30.0, 1.0, clock(), 0.1, 1.0, 0.0, 1, "")
        bad = StatEntry(2e302, 1.0, clock(), 0.1, 1.0, 0.0, 1, "")
        await push(t1, WireCodec("t9", SECRET), st.Delta({
            (MODEL, sig(t1, "fast"), "t9"): good, (MODEL, sig(t1, "slow"), "t9"): bad}), clock())
        origins = {k[2] for k in st.flat_entries(t1.router.stats)}
        assert "t9" in origins and t1.counters.rejected == {}
        assert entries_refused(t1) == {"invalid_entry": 1}
        assert learned(t1.router)["slow"] is None


async def test_an_unauthenticated_flood_is_bounded_per_origin(clock: FakeClock) -> None:
    """Before: 64 unauthenticated frames of 1,024 entries filled the store to 65,536. Twice
    the bound's worth of frames shows it (64 made this test take 30-90 s: the frames' encoding
    and decoding, not the bound)."""
    frames = 2 * st.MAX_ENTRIES_PER_ORIGIN // st.MAX_ENTRIES_PER_MESSAGE
    async with trackers(clock, MemoryNetwork(0), n=1) as (t0,):
        stranger = WireCodec("stranger")
        fake = StatEntry(1.0, 1.0, clock(), 0.1, 1.0, 0.0, 1, "")
        for frame in range(frames):
            delta = st.Delta({(MODEL, f"fake-{frame}-{i}", "stranger"): fake
                              for i in range(st.MAX_ENTRIES_PER_MESSAGE)})
            await push(t0, stranger, delta, clock())
        held = len(st.flat_entries(t0.router.stats))
        assert held == st.MAX_ENTRIES_PER_ORIGIN
        assert entries_refused(t0) == {"origin_full": frames * st.MAX_ENTRIES_PER_MESSAGE - held}


async def test_idle_sockets_do_not_starve_a_real_peer() -> None:
    """Before: 300 idle sockets held every inbound slot for 5 s each; a real peer timed out."""
    refused: list[str] = []

    async def answer(payload: bytes, sender: tuple[str, int]) -> bytes:
        return b"re:" + payload

    server = TcpTransport("127.0.0.1", 0, on_error=lambda e: refused.append(e.reason))
    async with anyio.create_task_group() as tg:
        host, port = await tg.start(server.serve, answer)
        async with AsyncExitStack() as stack:
            idle = [await stack.enter_async_context(await anyio.connect_tcp(host, port))
                    for _ in range(300)]
            # before, it waited behind 4 batches of 64 idle sockets, 5 s each: >= 5 s
            assert await TcpTransport().request((host, port), b"hello", 4.0) == b"re:hello"
            with anyio.fail_after(HANDSHAKE_TIMEOUT_S + 10):  # margin for a loaded machine
                for stream in (idle[0], idle[-1]):  # evicted at once / timed out
                    with pytest.raises((anyio.EndOfStream, anyio.BrokenResourceError, OSError)):
                        await stream.receive()
        tg.cancel_scope.cancel()
    assert refused and set(refused) == {"idle"}
