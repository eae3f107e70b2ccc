"""Clients' limits while the Redis store is away (issue 32): decided on the rows last read, not
from zero; what was admitted and settled meanwhile is written back when the store answers
again, and no settle is dropped. A real redis-server with AOF, killed and started again."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
import redis

from meshroute_middleware.core.clients import Client
from meshroute_middleware.core.clients_budget import (
    Admission,
    ClientGates,
    Spent,
    rows_of_request,
)
from meshroute_middleware.core.providers.keys import Refusal
from meshroute_middleware.state.fallback import RETRY_S, FallbackLimits
from meshroute_middleware.state.limits import LimitsStoreDown
from meshroute_middleware.state.redis_limits import RedisLimits

from ..redis_server import redis_server

T0 = 1_796_040_000.0  # 2026-11-29 12:00 UTC
ALICE = Client("alice", hashlib.sha256(b"k").digest(), rpm=5)


def gates(first_id: int) -> ClientGates:
    return ClientGates(first_id=first_id)


async def admit(store: FallbackLimits, now: float, first_id: int) -> Admission | Refusal:
    out = await store.transact_with(rows_of_request("alice", None, now), gates,
                                    lambda g: g.admit(ALICE, 10, now), now, first_id)
    result: Admission | Refusal = out.result
    return result


async def settle(store: FallbackLimits, admission: Admission, prompt: int,
                 now: float) -> None:
    spent = Spent("p/m", prompt, 1, 0.0, False)
    await store.transact_with(rows_of_request("alice", "p/m", now), gates,
                              lambda g: g.settle(admission, spent, now), now, 0)


def test_an_outage_decides_on_the_rows_last_read_and_writes_them_back(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with redis_server(tmp_path, aof=True) as server:
        async def run() -> None:
            store = FallbackLimits(RedisLimits(server.url), clock=lambda: T0 + 1)
            before = [await admit(store, T0, 1000 * i) for i in range(3)]
            assert all(isinstance(a, Admission) for a in before)
            await settle(store, before[0], 100, T0 + 0.5)  # type: ignore[arg-type]
            server.stop()
            during = [await admit(store, T0 + 1 + i * 0.01, 10_000 * (i + 1))
                      for i in range(5)]
            admitted = [a for a in during if isinstance(a, Admission)]
            assert len(admitted) == 2  # rpm 5, 3 already used as last read: not from zero
            assert not store.up and store.local_decisions == 5
            await settle(store, before[1], 200, T0 + 1.2)  # type: ignore[arg-type]
            await settle(store, admitted[0], 300, T0 + 1.3)
            with pytest.raises(LimitsStoreDown):
                await store.usage("alice", 0)
            assert store.owed == 4  # two admissions, two settles
            server.start()  # AOF: what was written before the kill is back
            again = await admit(store, T0 + 1.5 + RETRY_S, 99_000)
            assert isinstance(again, Refusal) and again.reason == "rpm"  # 3 + 2 written back
            assert store.up and store.owed == 0
            (row,) = await store.usage("alice", 0)
            assert (row["requests"], row["prompt_tokens"]) == (3, 600)
            await store.close()

        asyncio.run(run())
        with redis.Redis.from_url(server.url) as client:
            raw = client.get("meshroute:limits:clients:alice:0")
        assert raw is not None and b'"day_requests":5' in raw
    logged = [r.getMessage() for r in caplog.records]
    assert sum("failed" in m for m in logged) == 1
    assert sum("answers again;" in m for m in logged) == 1
