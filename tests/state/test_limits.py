"""Shared key gates: several processes' gates over one store behave as one gateway's; a store
that goes away leaves each tracker its share. Fake clock; the SQLite store on a real file."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from meshroute_middleware.core.providers.config import ProvidersConfig, parse_providers_config
from meshroute_middleware.core.providers.keys import KeyGates, Reservation
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.state.limits import LimitsStore, MemoryLimits
from meshroute_middleware.state.shared_gates import MAX_QUEUED, RETRY_S, SharedGates
from meshroute_middleware.state.sqlite_limits import SqliteLimits
from meshroute_middleware.state.store import StateStore

from ..conftest import FakeClock

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC).timestamp()
MIDNIGHT = datetime(2026, 12, 1, tzinfo=UTC).timestamp()
ROUTE = "fastco/big-model"


def config(keys: int = 1, monthly: int | None = None, **limits: int) -> ProvidersConfig:
    model: dict[str, Any] = {"id": "big-model", "tier": "large"}
    if monthly is not None:
        model["monthly_tokens"] = monthly
    return parse_providers_config({"providers": [
        {"name": "fastco", "base_url": "http://127.0.0.1:9/v1",
         "keys": [f"env:K{i}" for i in range(keys)], **limits, "models": [model]}]})


@pytest.fixture(params=["memory", "state-file"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LimitsStore]:
    if request.param == "memory":
        yield MemoryLimits()
        return
    path = str(tmp_path / "state.db")
    StateStore(path).open().close()  # the schema, as a gateway's start makes it
    opened = [SqliteLimits(path).open()]
    yield opened[0]
    opened[0].close()


def workers(cfg: ProvidersConfig, store: LimitsStore, tmp: Path | None = None,
            n: int = 3) -> list[SharedGates]:
    """n processes' gates: over one store object, or (SQLite) each with its own connection."""
    if isinstance(store, SqliteLimits):
        stores: list[LimitsStore] = [store] + [SqliteLimits(store.path).open()
                                               for _ in range(n - 1)]
    else:
        stores = [store] * n
    return [SharedGates(cfg, s, f"w{i}") for i, s in enumerate(stores)]


def take(gates: SharedGates, cfg: ProvidersConfig, now: float,
         tokens: int = 10) -> Reservation | None:
    p = cfg.providers[0]
    return asyncio.run(gates.atake(p, p.models[0], tokens, now))[0]


def test_rpm_10_over_three_workers_admits_10_in_the_minute(store: LimitsStore) -> None:
    cfg = config(rpm=10)
    gates = workers(cfg, store)
    admitted = [take(gates[i % 3], cfg, T0 + i * 0.1) for i in range(40)]
    assert sum(r is not None for r in admitted) == 10
    p = cfg.providers[0]
    refusal = gates[1].check(p, p.models[0], 1, 0, T0 + 4)
    assert refusal is not None and refusal.reason == "rpm" and refusal.until == T0 + 61
    assert take(gates[2], cfg, T0 + 61) is not None  # the first bucket left the minute


def test_rpd_and_the_monthly_budget_are_one_count(store: LimitsStore) -> None:
    cfg = config(rpd=5)
    gates = workers(cfg, store)
    assert sum(take(gates[i % 3], cfg, T0 + i * 100) is not None for i in range(12)) == 5
    assert take(gates[0], cfg, MIDNIGHT + 1) is not None  # a new UTC day
    budget = config(monthly=100)
    gates = workers(budget, MemoryLimits() if isinstance(store, MemoryLimits) else store)
    spent = 0
    for i in range(12):  # 30 tokens each, settled from `usage`
        got = take(gates[i % 3], budget, T0 + 86_400 * 2 + i, tokens=30)
        if got is not None:
            gates[(i + 1) % 3].settle(got, 30, T0 + 86_400 * 2 + i)
            spent += 30
    assert spent == 90  # a fourth 30 would pass 100, whichever worker asks


def test_a_cooldown_learned_by_one_worker_holds_in_all(store: LimitsStore) -> None:
    cfg = config(keys=1)
    a, b, c = workers(cfg, store)
    assert a.rate_limited(ROUTE, 1, 30.0, T0) == T0 + 30
    assert take(b, cfg, T0 + 1) is None and take(c, cfg, T0 + 29.5) is None
    assert take(c, cfg, T0 + 30.5) is not None
    # the ladder is shared too: a second 429 without Retry-After, in another worker
    assert b.rate_limited(ROUTE, 1, None, T0 + 31) == T0 + 31 + 120
    assert take(a, cfg, T0 + 152) is not None
    a.succeeded(ROUTE, 1)  # a success in one worker restarts the ladder for all
    assert c.rate_limited(ROUTE, 1, None, T0 + 153) == T0 + 153 + 30


def test_a_401_benches_the_key_everywhere_until_a_clear_to_any_worker(
        store: LimitsStore) -> None:
    cfg = config(keys=2)
    a, b, c = workers(cfg, store)
    a.revoke("fastco", "big-model", 1, 401)
    keys = [take(b if i % 2 else c, cfg, T0 + i) for i in range(6)]
    assert {r.key for r in keys if r is not None} == {2}
    assert [k["state"] for k in c.key_states(cfg.providers[0], cfg.providers[0].models[0],
                                             T0 + 7)] == ["revoked", "ready"]
    assert b.clear(ROUTE) == 1
    assert {r.key for r in (take(a, cfg, T0 + 10 + i) for i in range(4)) if r} == {1, 2}


def test_round_robin_position_and_reservations_are_shared(store: LimitsStore) -> None:
    cfg = config(keys=3, tpm=100)
    a, b = workers(cfg, store, n=2)
    got = [take(a if i % 2 else b, cfg, T0, tokens=60) for i in range(3)]
    assert [r.key for r in got if r] == [1, 2, 3]  # one rotation, not one per worker
    assert take(a, cfg, T0, tokens=60) is None  # every key holds 60 in flight: tpm 100
    assert got[0] is not None
    b.settle(got[0], 0, T0 + 1)  # settled by another worker than took it: the key is free
    again = take(a, cfg, T0 + 1, tokens=60)
    assert again is not None and again.key == 1


def test_a_store_gone_leaves_each_tracker_its_share_and_comes_back() -> None:
    cfg = config(rpm=10)
    store = MemoryLimits()
    a, b = workers(cfg, store, n=2)
    for g in (a, b):
        g.trackers = 2  # as the store's heartbeat counted them
    store.down = True
    admitted = [take(a, cfg, T0 + i * 0.01) for i in range(20)]
    assert sum(r is not None for r in admitted) == 5  # 10 / 2 trackers
    assert not a.up and a.mode == "local" and a.fallback_decisions == 20
    families = {f.name: f for f in a.metric_families()}
    assert families["meshroute_limits_store_up"].samples[0].value == 0
    store.down = False
    assert take(a, cfg, T0 + RETRY_S / 2) is None  # still local within RETRY_S
    assert take(a, cfg, T0 + RETRY_S + 0.5) is not None  # back to the store
    assert a.up and a.mode == "local"  # MemoryLimits' own mode name
    # a's 5 local takes were written back before its next: 10 - 5 - 1 left for b
    assert sum(take(b, cfg, T0 + 2 + i * 0.01) is not None for i in range(20)) == 4


def test_local_gates_start_from_the_rows_last_read_and_settles_are_written_back() -> None:
    cfg = config(rpm=10)
    store = MemoryLimits()
    a, b = workers(cfg, store, n=2)
    for g in (a, b):
        g.trackers = 2  # as the heartbeat counts them
    sent = [take(b, cfg, T0) for _ in range(4)] + [take(a, cfg, T0)]  # a reads 5 used
    store.down = True
    local = [take(a, cfg, T0 + 0.5 + i * 0.01) for i in range(10)]
    assert sum(r is not None for r in local) == 2  # half of the 5 left (4 / 2 rounded down)
    first = next(r for r in local if r is not None)
    a.settle(first, 7, T0 + 0.7)  # applied locally, owed to the store
    store.down = False
    assert take(a, cfg, T0 + RETRY_S + 2) is not None  # writes back first, then takes
    window = store.rows[("windows", "fastco", 1)]
    assert window["day_requests"] == 5 + 2 + 1 and window["day_tokens"] == 7
    assert first.id not in [i for i, _, _ in window["inflight"]]  # settled there too
    assert all(r is not None for r in sent)


def test_the_share_of_a_minute_spread_over_seconds_is_half_of_its_sum() -> None:
    """10 of rpm 20 used over four seconds in odd counts (3, 3, 1, 3): each of two trackers
    has 5 left while the store is away, not 3 (each second's count rounded up on its own:
    CI's outage share came out [1, 1] for [2, 2] whenever its requests crossed a second)."""
    cfg = config(rpm=20)
    store = MemoryLimits()
    a, b = workers(cfg, store, n=2)
    for g in (a, b):
        g.trackers = 2  # as the heartbeat counts them
    for second, (g, n) in enumerate(((a, 3), (b, 3), (b, 1), (a, 3))):
        assert all(take(g, cfg, T0 + second + i * 0.01) is not None for i in range(n))
    assert a.trackers == 2
    store.down = True
    local = [take(a, cfg, T0 + 4.5 + i * 0.01) for i in range(10)]
    assert sum(r is not None for r in local) == 5


def test_reservations_in_flight_are_shared_together_not_each_rounded_up() -> None:
    """26 tokens in flight over six reservations (five of 5, one of 1): each of two trackers
    holds 13 of them while the store is away, not 5 x 3 + 1 = 16 (each rounded up on its
    own), so 37 of its 50 (tpm 100 / 2) are left, not 34."""
    cfg = config(tpm=100)
    store = MemoryLimits()
    a, b = workers(cfg, store, n=2)
    for g in (a, b):
        g.trackers = 2  # as the heartbeat counts them
    assert all(take(b, cfg, T0, tokens=5) is not None for _ in range(5))
    assert take(a, cfg, T0, tokens=1) is not None  # a reads the rows: 26 in flight
    store.down = True
    assert take(a, cfg, T0 + 0.5, tokens=38) is None  # 13 + 38 > 50
    assert take(a, cfg, T0 + 0.6, tokens=37) is not None  # 13 + 37 = 50
    assert not a.up


def test_sqlite_rows_are_the_state_files_own(tmp_path: Path) -> None:
    """What the shared gates write is what a restarted single process restores."""
    path = str(tmp_path / "state.db")
    StateStore(path).open().close()
    cfg = config(rpd=3)
    gates = SharedGates(cfg, SqliteLimits(path).open(), "w0")
    for i in range(3):
        assert take(gates, cfg, T0 + i) is not None
    with StateStore(path) as state:
        restored = ProviderRouter(cfg, KeyGates())
        restored.restore(state.load())
    p = cfg.providers[0]
    refusal = restored.gates.check(p, p.models[0], 1, 0, T0 + 10)
    assert refusal is not None and refusal.reason == "rpd"
    SqliteLimits.new_run(path)  # a new run of workers: no revocation or reservation kept


def test_an_async_store_that_cannot_keep_up_counts_as_failed() -> None:
    cfg = config(rpm=10)

    class Slow(MemoryLimits):
        blocking = False

    async def run() -> None:
        gates = SharedGates(cfg, Slow(), "t")
        for i in range(MAX_QUEUED + 1):  # queued, never drained: the loop is never yielded
            gates.rate_limited(ROUTE, 1, 1.0, T0 + i)
        assert not gates.up and gates.failures == 1

    asyncio.run(run())


@pytest.mark.anyio
async def test_the_share_during_an_outage_counts_every_tracker_of_the_last_minute() -> None:
    """Issue 33 item 10: b took its first key before a came; a came 10 s before the store
    went away. b's heartbeats (every HEARTBEAT_S, requests or not) counted a meanwhile, so b
    admits half of the limit during the outage, not all of it; a tracker quiet for over a
    minute no longer counts."""
    cfg = config(rpm=10)
    store = MemoryLimits()
    clock = FakeClock(T0)
    ticks = asyncio.Event()

    async def sleep(_: float) -> None:  # a heartbeat loop's wait: until the test says so
        await ticks.wait()
        ticks.clear()

    a, b = (SharedGates(cfg, store, name, clock, sleep) for name in ("a", "b"))
    p = cfg.providers[0]
    beats = {b: asyncio.ensure_future(b.heartbeats())}  # b's lifespan: b alone counts 1
    await asyncio.sleep(0)
    assert (await b.atake(p, p.models[0], 10, T0))[0] is not None
    assert b.trackers == 1
    clock.advance(5)
    beats[a] = asyncio.ensure_future(a.heartbeats())  # a's lifespan: it counts 2
    await asyncio.sleep(0)
    assert (await a.atake(p, p.models[0], 10, clock()))[0] is not None
    assert a.trackers == 2 and b.trackers == 1  # b has not looked since
    clock.advance(10)
    await _tick(ticks)  # b's loop beats: it sees a (10 s ago, within the minute)
    assert b.trackers == 2
    store.down = True
    clock.advance(1)
    local = [(await b.atake(p, p.models[0], 10, clock() + i * 0.01))[0] for i in range(10)]
    assert sum(r is not None for r in local) == 4  # half of the 8 left, not all of it
    assert not b.up
    # the store back, a gone (its process ended) for over a minute: b counts itself only
    beats[a].cancel()
    store.down = False
    clock.advance(61)
    await _tick(ticks)
    assert b.trackers == 1
    beats[b].cancel()


@pytest.mark.anyio
async def test_taking_a_key_waits_for_no_heartbeat_of_its_own() -> None:
    """Who uses the store is counted by the background heartbeat (`heartbeats`) alone: a
    request's take makes no heartbeat round trip to the store, however long since the last
    one (it used to, once a second, on the request path)."""

    class Counting(MemoryLimits):
        beats = 0

        async def heartbeat(self, tracker: str, now: float) -> int:
            self.beats += 1
            return await super().heartbeat(tracker, now)

    cfg = config(rpm=100)
    store = Counting()
    gates = SharedGates(cfg, store, "a", FakeClock(T0))
    p = cfg.providers[0]
    for i in range(3):
        assert (await gates.atake(p, p.models[0], 10, T0 + 2 * i))[0] is not None
    assert store.beats == 0
    await gates.beat(T0 + 10)  # what the heartbeat loop calls
    assert store.beats == 1 and gates.trackers == 1


async def _tick(ticks: asyncio.Event) -> None:
    """Let every heartbeat loop run one round."""
    ticks.set()
    for _ in range(5):
        await asyncio.sleep(0)
