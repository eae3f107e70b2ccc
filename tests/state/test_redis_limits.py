"""Shared key gates in a real redis-server: exact across trackers, each tracker's share while
it is gone, exact again once it is back; rows named by provider and position, and expiring."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import redis

from meshroute_middleware.core.providers.config import ProvidersConfig
from meshroute_middleware.core.providers.keys import Reservation
from meshroute_middleware.state.redis_limits import RedisLimits
from meshroute_middleware.state.shared_gates import RETRY_S, SharedGates

from ..redis_server import redis_server
from .test_limits import ROUTE, T0, config


async def take(gates: SharedGates, cfg: ProvidersConfig, now: float,
               tokens: int = 10) -> Reservation | None:
    p = cfg.providers[0]
    return (await gates.atake(p, p.models[0], tokens, now))[0]


def test_two_trackers_share_one_budget_and_a_share_while_the_store_is_away(
        tmp_path: Path) -> None:
    with redis_server(tmp_path) as server:
        cfg = config(keys=2, rpm=5)

        async def run() -> None:
            a, b = (SharedGates(cfg, RedisLimits(server.url), f"t{i}") for i in range(2))
            got = await asyncio.gather(*(take(a if i % 2 else b, cfg, T0 + i * 0.01)
                                         for i in range(30)))
            assert sum(r is not None for r in got) == 10  # 2 keys x rpm 5, over both
            assert sorted(r.key for r in got if r) == [1] * 5 + [2] * 5
            a.rate_limited(ROUTE, 1, 120.0, T0 + 61)  # queued, applied before a's next take
            await take(a, cfg, T0 + 61.5)
            assert (await take(b, cfg, T0 + 61.6)).key == 2  # b sees a's cooldown
            a.revoke("fastco", "big-model", 2, 401)
            await take(a, cfg, T0 + 62)  # drains a's queue first
            assert await take(b, cfg, T0 + 62.1) is None  # key 1 cools, key 2 revoked
            await b.refresh(T0 + 62.2)
            assert b.clear(ROUTE) == 2
            assert await take(b, cfg, T0 + 62.3) is not None
            with redis.Redis.from_url(server.url) as client:
                names = sorted(k.decode() for k in client.keys("meshroute:limits:*"))
                assert "meshroute:limits:windows:fastco:1" in names
                assert "meshroute:limits:keys:fastco/big-model:1" in names
                assert all(client.pttl(k) > 0 for k in names if ":windows:" in k)
                dump = b"".join(client.get(k) or b"" for k in names if "trackers" not in k)
                assert b"env:K" not in dump
            await a.store.close()  # type: ignore[attr-defined]
            await b.store.close()  # type: ignore[attr-defined]

        asyncio.run(run())


def test_store_killed_then_restarted(tmp_path: Path) -> None:
    with redis_server(tmp_path) as server:
        cfg = config(rpm=10)

        async def run() -> None:
            a, b = (SharedGates(cfg, RedisLimits(server.url), f"t{i}") for i in range(2))
            for g in (b, a):  # their heartbeat loops: a counts 2 trackers using the store
                await g.beat(T0)
            assert await take(b, cfg, T0) is not None
            assert await take(a, cfg, T0) is not None
            assert a.trackers == 2
            server.stop()
            got = [await take(a, cfg, T0 + 1 + i * 0.01) for i in range(12)]
            # a last read 2 used: its half of the 8 left
            assert sum(r is not None for r in got) == 4
            assert not a.up and a.fallback_decisions == 12
            up = {f.name: f for f in a.metric_families()}["meshroute_limits_store_up"]
            assert up.samples[0].value == 0
            server.start()  # empty (no persistence): a writes its 4 back before its take
            assert await take(a, cfg, T0 + 2 + RETRY_S) is not None  # back to the store
            assert a.up
            total = [await take(b, cfg, T0 + 3 + i * 0.01) for i in range(12)]
            assert sum(r is not None for r in total) == 5  # 10 - a's 4 written back - 1
            assert b.up and b.fallback_decisions == 0  # its stale connection was made anew
            await a.store.close()  # type: ignore[attr-defined]
            await b.store.close()  # type: ignore[attr-defined]

        asyncio.run(run())


def test_ledger_rows_are_indexed_per_client_and_expire_after_the_retention(
        tmp_path: Path) -> None:
    from meshroute_middleware.core.clients import Client
    from meshroute_middleware.core.clients_budget import (
        ClientGates,
        Spent,
        rows_of_request,
    )

    clients = [Client(n, b"-" * 32) for n in ("ann", "bob")]

    async def spend(store: RedisLimits, client: Client, route: str, now: float) -> None:
        def gates(first_id: int) -> ClientGates:
            return ClientGates(first_id=first_id)

        admitted = (await store.transact_with(rows_of_request(client.name, None, now), gates,
                                              lambda g: g.admit(client, 5, now), now, 1)).result
        await store.transact_with(rows_of_request(client.name, route, now), gates,
                                  lambda g: g.settle(admitted, Spent(route, 3, 2, 0.0, False),
                                                     now), now, 0)

    with redis_server(tmp_path) as server:
        async def run() -> None:
            store = RedisLimits(server.url, retention_days=2)
            day = int(T0 // 86400)
            for i, when in enumerate((T0, T0 + 86400, T0 + 5 * 86400)):
                await spend(store, clients[i % 2], "p/m", when)
            assert [(r["client"], r["day"]) for r in await store.usage("ann", 0)] == [
                ("ann", day + 5)]  # written on day + 5: day's row left the index
            assert [r["day"] for r in await store.usage("bob", 0)] == [day + 1]
            assert len(await store.usage(None, 0)) == 2
            assert await store.usage("ann", day + 6) == []
            with redis.Redis.from_url(server.url) as client:
                ttl_s = client.pttl(f"meshroute:limits:usage:ann p/m:{day + 5}") / 1000
                assert ttl_s == pytest.approx((day + 5 + 1 + 2) * 86400 - (T0 + 5 * 86400),
                                              abs=60)
                assert client.pttl("meshroute:ledger:ann") > 0
            await store.close()

        asyncio.run(run())


def test_ledger_rows_of_an_older_version_are_indexed_once_and_given_an_expiry(
        tmp_path: Path) -> None:
    day = int(T0 // 86400)
    with redis_server(tmp_path) as server:
        with redis.Redis.from_url(server.url) as client:  # the layout before the index
            client.set(f"meshroute:limits:usage:ann p/m:{day}", '{"client":"ann","route":"p/m",'
                       f'"day":{day},"requests":4,"prompt_tokens":1,"completion_tokens":1,'
                       '"cost_usd":0.0,"errors":0}')

        async def run() -> None:
            store = RedisLimits(server.url)
            assert [r["requests"] for r in await store.usage("ann", 0)] == [4]
            assert [r["client"] for r in await store.usage(None, 0)] == ["ann"]
            await store.close()

        asyncio.run(run())
        with redis.Redis.from_url(server.url) as client:
            assert client.pttl(f"meshroute:limits:usage:ann p/m:{day}") > 0
            assert client.get("meshroute:ledger-indexed") == b"1"


def test_a_slow_answer_or_a_busy_pool_is_not_an_outage(tmp_path: Path) -> None:
    from meshroute_middleware.core.clients import Client
    from meshroute_middleware.core.clients_budget import Admission, ClientGates, client_row

    with redis_server(tmp_path) as server:
        cfg = config(rpm=1000)

        def gates(first_id: int) -> ClientGates:
            return ClientGates(first_id=first_id)

        async def admit(store: RedisLimits, i: int) -> object:
            client = Client(f"c{i}", b"-" * 32, rpm=1)
            out = await store.transact_with([client_row(client.name)], gates,
                                            lambda g: g.admit(client, 1, T0), T0, i << 10)
            return out.result

        async def run() -> None:
            shared = SharedGates(cfg, RedisLimits(server.url, pool_size=2), "t")
            assert await take(shared, cfg, T0) is not None
            store = RedisLimits(server.url, pool_size=2)
            with redis.Redis.from_url(server.url) as client:
                client.execute_command("CLIENT", "PAUSE", "600", "ALL")  # 0.6 s, no answer
            # 50 key decisions on one route and 50 clients' on rows of their own, each over
            # 2 connections, the first ones waiting 0.6 s for an answer
            got, admitted = await asyncio.gather(
                asyncio.gather(*(take(shared, cfg, T0 + 0.1 + i * 0.001) for i in range(50))),
                asyncio.gather(*(admit(store, i) for i in range(50))))
            assert all(r is not None for r in got)
            assert all(isinstance(a, Admission) for a in admitted)
            assert shared.up and shared.failures == 0 and shared.fallback_decisions == 0
            await shared.store.close()  # type: ignore[attr-defined]
            await store.close()

        asyncio.run(run())


def test_a_store_that_stops_answering_fails_every_waiting_decision_at_once(
        tmp_path: Path) -> None:
    from meshroute_middleware.core.clients import Client
    from meshroute_middleware.core.clients_budget import ClientGates, client_row
    from meshroute_middleware.state.limits import LimitsStoreDown

    alice = Client("alice", b"-" * 32, rpm=1000)

    async def admit(store: RedisLimits, i: int) -> str:
        try:
            await store.transact_with([client_row("alice")], lambda f: ClientGates(first_id=f),
                                      lambda g: g.admit(alice, 1, T0), T0, i << 10)
        except LimitsStoreDown as exc:
            return str(exc)
        return "decided"

    with redis_server(tmp_path) as server:
        async def run() -> None:
            store = RedisLimits(server.url, timeout_s=0.3, deadline_s=3.0)
            assert await admit(store, 0) == "decided"
            with redis.Redis.from_url(server.url) as client:
                client.execute_command("CLIENT", "PAUSE", "2500", "ALL")
            loop = asyncio.get_running_loop()
            started = loop.time()
            answers = await asyncio.gather(*(admit(store, i) for i in range(1, 21)))
            took_s = loop.time() - started
            assert "timeout" in answers[0].lower()
            assert all("failed meanwhile" in a for a in answers[1:])
            # one answer timeout (0.3 s), not the deadline (3 s) nor 20 timeouts in turn
            assert took_s < 2.0, took_s
            await asyncio.sleep(2.6 - took_s)  # the pause is over
            assert await admit(store, 99) == "decided"
            await store.close()

        asyncio.run(run())


def test_what_was_taken_locally_is_written_back_once_under_concurrent_takes(
        tmp_path: Path) -> None:
    with redis_server(tmp_path) as server:
        cfg = config(rpm=100)

        async def run() -> None:
            gates = SharedGates(cfg, RedisLimits(server.url), "t")
            assert await take(gates, cfg, T0) is not None
            server.stop()
            local = [await take(gates, cfg, T0 + 0.1 + i * 0.01) for i in range(7)]
            assert all(r is not None for r in local) and not gates.up
            server.start()  # empty: the store holds what is written back, nothing else
            got = await asyncio.gather(*(take(gates, cfg, T0 + RETRY_S + 1 + i * 0.001)
                                         for i in range(10)))
            assert all(r is not None for r in got) and gates.up
            with redis.Redis.from_url(server.url) as client:
                raw = client.get("meshroute:limits:windows:fastco:1")
            assert raw is not None and b'"day_requests":17' in raw  # 7 written back once
            await gates.store.close()  # type: ignore[attr-defined]

        asyncio.run(run())
