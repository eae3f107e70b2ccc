"""Saturation curves through gossip (issue 14): a knee learned on one tracker routes another.

Three trackers on the in-memory network, a - c - b (b never talks to a; c relays, the frames
being signed). On a mesh where the fast node is serial (100 tok/s alone, shared by all it
runs) and the other batches freely (60 tok/s per request at any load), four requests at once
are best placed one on the fast node and three on the roomy one. Tracker a learns that; b,
which has measured nothing, must place them the same way from a's curves alone.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import pytest

from gossip import state as st
from gossip import stats_wire
from gossip.memory import MemoryNetwork
from gossip.service import GossipConfig, GossipService
from gossip.wire import WireCodec
from meshroute_middleware.core.config import RouterConfig
from meshroute_middleware.core.policies import Outcome
from meshroute_middleware.core.router import Router
from meshroute_middleware.core.stats import StatEntry
from meshroute_middleware.core.topology import NodeRecord
from tests.conftest import FakeClock
from tests.gossip.helpers import run_round
from tests.gossip.test_attacks import entries_refused, push

pytestmark = pytest.mark.anyio
MODEL = "m"
SECRET = b"mesh secret"
NODES = (NodeRecord("fast", MODEL, 0, 9, 10, "http://127.0.0.1:9/a", tps=100.0),
         NodeRecord("roomy", MODEL, 0, 9, 10, "http://127.0.0.1:9/b", tps=60.0))
SPEED: dict[str, Callable[[int], float]] = {"fast": lambda c: 100.0 / c,  # serial
                                             "roomy": lambda c: 60.0}  # batches freely
LINKS = {"a": ("c",), "c": ("a", "b"), "b": ("c",)}


def make_router(origin: str, clock: FakeClock) -> Router:
    router = Router(RouterConfig(), clock=clock, rng=random.Random(7), origin=origin)
    for node in NODES:
        router.upsert_node(node)
    return router


@asynccontextmanager
async def chain(clock: FakeClock) -> AsyncIterator[dict[str, GossipService]]:
    network = MemoryNetwork(0)
    async with AsyncExitStack() as stack:
        services = {}
        for i, (name, peers) in enumerate(LINKS.items()):
            config = GossipConfig((name, 1), tuple((p, 1) for p in peers), interval_s=1e6,
                                  fanout=2, secret=SECRET, timeout_s=1.0)
            services[name] = await stack.enter_async_context(GossipService(
                make_router(name, clock), config, transport=network.transport((name, 1)),
                rng=random.Random(i)))
        yield services


def train(router: Router, clock: FakeClock) -> None:
    """Pinned requests on each node, c at a time (c = 1, 2, 3), one second each."""
    for node in ("fast", "roomy"):
        for c, rounds in ((1, 20), (2, 6), (3, 4)):
            for _ in range(rounds):
                decisions = [router.choose(MODEL, pin=[node]) for _ in range(c)]
                clock.advance(1.0)
                for d in decisions:
                    router.record(d, Outcome(round(SPEED[node](c)), 1.0, 0.1))


def on_fast(router: Router, trials: int = 200, k: int = 4) -> Counter[int]:
    """How many of k requests in flight at once go to the fast node, over `trials` tries."""
    counts: Counter[int] = Counter()
    for _ in range(trials):
        decisions = [router.choose(MODEL) for _ in range(k)]
        counts[sum(d.route.head.node_id == "fast" for d in decisions)] += 1
        for d in decisions:
            router.cancel(d)
    return counts


async def gossip(services: dict[str, GossipService], clock: FakeClock, rounds: int = 3) -> None:
    for _ in range(rounds):
        clock.advance(1.0)
        for service in services.values():
            await run_round(service)


async def test_b_routes_by_the_knee_a_learned_before_measuring_anything(
        clock: FakeClock) -> None:
    async with chain(clock) as services:
        a, b = services["a"].router, services["b"].router
        train(a, clock)
        await gossip(services, clock)
        assert all(set(b.stats.entries(MODEL, r.signature)) == {"a"} for r in b.candidates(MODEL))
        assert b.policy.estimate(b.candidates(MODEL)[0].signature) is None  # b measured nothing
        assert on_fast(a) == Counter({1: 200})  # a: one on the serial node, three elsewhere
        # b, from a's curves alone: the same split (tolerance: none; 200 seeded tries)
        assert on_fast(b) == Counter({1: 200})


async def test_without_curves_b_piles_onto_the_fast_node(clock: FakeClock,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: the same run with a sharing no curve (as before issue 14). b knows each
    route's mean speed and guesses the knee: most tries put 2 or more on the serial node."""
    async with chain(clock) as services:
        a, b = services["a"].router, services["b"].router
        monkeypatch.setattr(a.policy, "curve_summary", lambda signature: None)
        train(a, clock)
        await gossip(services, clock)
        assert on_fast(a) == Counter({1: 200})
        assert sum(n for k, n in on_fast(b).items() if k >= 2) >= 100  # measured: 173 of 200


async def test_a_bad_curve_is_refused_counted_and_its_entry_with_it(
        clock: FakeClock, monkeypatch: pytest.MonkeyPatch) -> None:
    async with chain(clock) as services:
        b = services["b"]
        sig = b.router.candidates(MODEL)[0].signature
        good = StatEntry(30.0, 1.0, clock(), 0.1, 1.0, 0.0, 1, "", ((0, 1.0, 3.4),))
        bad = good._replace(curve=((0, 1.0, float("nan")),))
        monkeypatch.setattr(stats_wire, "curve_sendable", lambda curve: True)  # a broken sender
        await push(b, WireCodec("t9", SECRET), st.Delta({
            (MODEL, sig, "t9"): bad, (MODEL, sig, "t8"): good}), clock())
        assert entries_refused(b) == {"invalid_curve": 1}
        assert set(b.router.stats.entries(MODEL, sig)) == {"t8"}
        assert b.router.stats.entries(MODEL, sig)["t8"].curve == ((0, 1.0, 3.4),)
        assert b.counters.rejected == {}

