"""Three trackers gossiping over real TCP on loopback with the wall clock."""

from __future__ import annotations

import random
import time
from contextlib import AsyncExitStack

import anyio
import pytest

from gossip.service import GossipConfig, GossipService
from tests.gossip.helpers import MODEL, close, learned, make_router, record, shares

pytestmark = pytest.mark.anyio
INTERVAL_S = 0.1
PATIENCE_S = 60.0


async def test_three_trackers_learn_from_the_first_over_loopback() -> None:
    # adr0021: its exploit split has a closed form (P ∝ tps) to check the shared view against
    routers = [make_router(f"tracker-{i}", time.time, policy="adr0021") for i in range(3)]
    async with AsyncExitStack() as stack:
        services: list[GossipService] = []
        for router in routers:  # each new tracker knows the ones started before it
            peers = tuple(s.address for s in services if s.address is not None)
            config = GossipConfig(("127.0.0.1", 0), peers, INTERVAL_S, 3, b"loopback secret")
            services.append(await stack.enter_async_context(
                GossipService(router, config, rng=random.Random(len(services)))))
        for s in services:  # and earlier ones learn later ones at run time (as from mDNS)
            for other in services:
                if other is not s and other.address is not None:
                    s.membership.add_peer(*other.address)
        record(routers[0], "fast", 100.0, 4)
        record(routers[0], "slow", 40.0, 4)
        truth = learned(routers[0])
        # Patience, not speed (bench_gossip measures rounds to converge): on a loaded 2-core
        # machine a few rounds can take seconds of wall clock.
        start = time.monotonic()
        while time.monotonic() - start < PATIENCE_S:
            await anyio.sleep(INTERVAL_S / 2)
            if all(all(close(truth[h], v) for h, v in learned(r).items()) for r in routers[1:]):
                break
        rejected = [dict(s.counters.rejected) for s in services]  # before teardown races
    for router in routers[1:]:
        got = learned(router)
        assert close(got["fast"], truth["fast"]) and close(got["slow"], truth["slow"]), got
        assert shares(router) == pytest.approx(shares(routers[0]), abs=0.01)
    picks = [routers[2].choose(MODEL).route.head.node_id for _ in range(2000)]
    # exploit P ∝ tps: 100 / 140 = 0.714; 2000 seeded draws, tolerance ±0.03 (> 3 sigma)
    assert abs(picks.count("fast") / 2000 - 100 / 140) < 0.03
    assert rejected == [{}, {}, {}]
