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
            assert await take(b, cfg, T0) is not None
            assert await take(a, cfg, T0) is not None  # a counts 2 trackers using the store
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
