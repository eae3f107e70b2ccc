"""Gossip under faults, on the in-memory network and a fake clock: a peer that disappears,
a partition held for a minute then healed, clocks ±5 s apart."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
import pytest

from gossip.memory import MemoryNetwork
from gossip.peers import BACKOFF_MAX_S
from gossip.service import GossipConfig, GossipService
from tests.conftest import FakeClock
from tests.gossip.helpers import MODEL, close, learned, make_router, record, run_round

pytestmark = pytest.mark.anyio
SECRET = b"faults"
USUAL_ROUNDS = 6  # what a healthy 4-tracker cluster with fanout 1 needs (test_service.py)


def skewed(clock: FakeClock, offset: float) -> Callable[[], float]:
    return lambda: clock() + offset


@asynccontextmanager
async def cluster(clocks: list[Callable[[], float]], network: MemoryNetwork, fanout: int = 1,
                  ) -> AsyncIterator[list[GossipService]]:
    addresses = [(f"t{i}", 1) for i in range(len(clocks))]
    async with AsyncExitStack() as stack:
        services = []
        for i, (address, clock) in enumerate(zip(addresses, clocks, strict=True)):
            config = GossipConfig(address, tuple(a for a in addresses if a != address),
                                  interval_s=1e6, fanout=fanout, secret=SECRET, timeout_s=1.0)
            service = GossipService(make_router(f"t{i}", clock), config,
                                    transport=network.transport(address), rng=random.Random(i))
            services.append(await stack.enter_async_context(service))
        yield services


async def rounds(services: list[GossipService], clock: FakeClock, k: int) -> None:
    for _ in range(k):
        clock.advance(1.0)
        async with anyio.create_task_group() as tg:
            for service in services:
                tg.start_soon(run_round, service)


def samples(service: GossipService) -> dict[str, int]:
    rows = service.router.routing_table(MODEL)["models"][MODEL]["candidates"]
    return {row["head"]: row["samples"] for row in rows}


def agree(services: list[GossipService]) -> bool:
    first = learned(services[0].router)
    return all(all(close(first[h], v) for h, v in learned(s.router).items())
               for s in services[1:])


async def converge(services: list[GossipService], clock: FakeClock, limit: int) -> int:
    done = 0
    while not agree(services):
        assert done < limit, f"no agreement after {done} rounds"
        await rounds(services, clock, 1)
        done += 1
    return done


async def test_a_peer_that_disappears_never_stalls_the_others(clock: FakeClock) -> None:
    network = MemoryNetwork(1)
    async with cluster([clock] * 4, network) as services:
        record(services[0].router, "fast", 70.0, 3)
        await converge(services, clock, USUAL_ROUNDS + 4)
        gone = services.pop()  # it vanishes: its address stops answering, mid-run
        network.partition([("t3", 1)], [("t0", 1), ("t1", 1), ("t2", 1)])
        record(services[1].router, "slow", 25.0, 2)
        took = await converge(services, clock, USUAL_ROUNDS + 4)
        assert learned(services[2].router)["slow"] == pytest.approx(25.0)
        failures = sum(s.counters.exchange_failures for s in services)
        assert failures >= 1 and all(s.counters.rejected.keys() <= {"unreachable", "timeout"}
                                     for s in services)
        assert learned(gone.router)["slow"] is None  # nothing reached the vanished peer
        assert took <= USUAL_ROUNDS + 4


async def test_a_minute_long_partition_heals_within_the_backoff_and_the_usual_rounds(
        clock: FakeClock) -> None:
    network = MemoryNetwork(9)
    async with cluster([clock] * 4, network) as services:
        network.partition([("t0", 1), ("t1", 1)], [("t2", 1), ("t3", 1)])
        for minute_second in range(60):  # learning goes on on both sides of the cut
            side = services[0] if minute_second % 2 else services[2]
            record(side.router, "fast" if side is services[0] else "slow",
                   80.0 if side is services[0] else 30.0)
            await rounds(services, clock, 1)
        assert learned(services[1].router)["slow"] is None
        assert learned(services[3].router)["fast"] is None
        network.heal()  # no backoff is reset by hand: the cluster has to find its way back
        took = await converge(services, clock, int(BACKOFF_MAX_S) + USUAL_ROUNDS)
        for service in services:
            assert samples(service) == {"fast": 30, "slow": 30}, samples(service)
        print(f"healed after {took} rounds")  # docs/reliability.md quotes it


@pytest.mark.parametrize("offsets", [(0.0, 5.0, -5.0), (0.0, -5.0, 5.0)])
async def test_clocks_five_seconds_apart_lose_and_double_count_nothing(
        clock: FakeClock, offsets: tuple[float, float, float]) -> None:
    network = MemoryNetwork(3, duplicate_rate=0.3)
    clocks = [skewed(clock, o) for o in offsets]
    async with cluster(clocks, network, fanout=2) as services:
        clock.advance(2 * max(offsets))  # the nodes joined a while ago (see the next test)
        for k, service in enumerate(services):  # every tracker learns on its own clock
            record(service.router, "fast", 50.0 + 10 * k, 4)
            record(service.router, "slow", 20.0, k + 1)
        await converge(services, clock, USUAL_ROUNDS + 4)
        for _ in range(3):  # more samples while gossiping: replaced, never added twice
            for service in services:
                record(service.router, "fast", 60.0, 1)
            await rounds(services, clock, 2)
        await converge(services, clock, USUAL_ROUNDS + 4)
        await rounds(services, clock, 3)
        want = {"fast": 3 * 4 + 3 * 3, "slow": 1 + 2 + 3}
        for service in services:
            assert samples(service) == want, (service.origin, samples(service))
            assert not service.counters.entries_refused, service.counters.entries_refused
            assert service.counters.rejected.keys() <= {"replayed"}  # the duplicated frames


async def test_a_sample_right_after_a_join_survives_five_seconds_of_skew(clock: FakeClock,
                                                                       ) -> None:
    clocks = [skewed(clock, 0.0), skewed(clock, 5.0)]
    async with cluster(clocks, MemoryNetwork(4), fanout=1) as services:
        clock.advance(1.0)  # one second after the nodes joined, on t0's clock
        record(services[0].router, "fast", 50.0, 3)
        await rounds(services, clock, 3)
        for service in services:
            assert samples(service)["fast"] == 3, (service.origin, samples(service))
