"""A key costs little (issue 32): a client without limits is admitted with no store
transaction and its usage written behind (chat/ledger.py); the one process's own gates are
held live (state/live_clients.py). What is written behind is never dropped: a failed flush is
retried, reading the ledger flushes first, shutdown flushes once more."""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import pytest
from starlette.types import Message

from meshroute_middleware.chat.spend import ClientRefused, ClientSpend
from meshroute_middleware.core.clients import Client
from meshroute_middleware.core.clients_budget import CLIENTS, NO_ROUTE, Spent
from meshroute_middleware.core.providers.keys import RowName
from meshroute_middleware.http.request import parse_chat
from meshroute_middleware.state.limits import G, MemoryLimits, Outcome
from meshroute_middleware.state.live_clients import LiveClients

from ..conftest import FakeClock

pytestmark = pytest.mark.anyio
T0 = 1_796_040_000.0
FREE = Client("free", hashlib.sha256(b"free").digest())
BOB = Client("bob", hashlib.sha256(b"bob").digest(), rpm=2)
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "' + b"x" * 40 + b'"}]}'


class CountingStore(MemoryLimits):
    """MemoryLimits that counts its transactions."""

    def __init__(self) -> None:
        super().__init__()
        self.transactions = 0

    async def transact_with(self, rows: Sequence[RowName], make: Callable[[int], G],
                            op: Callable[[G], Any], now: float,
                            first_id: int) -> Outcome[Any]:
        self.transactions += 1
        return await super().transact_with(rows, make, op, now, first_id)


async def _drop(message: Message) -> None:
    pass


async def _one(spend: ClientSpend, client: Client, completion: int = 9) -> None:
    metered = await spend.admit(client, parse_chat(BODY), _drop)
    await metered({"type": "http.response.start", "status": 200,
                   "headers": [(b"content-type", b"application/json")]})
    await metered({"type": "http.response.body", "body": b'{"usage": {"prompt_tokens": 4, '
                   b'"completion_tokens": ' + str(completion).encode() + b"}}"})


async def never(_: float) -> None:  # the flusher waits past the test: flushes are explicit
    await asyncio.Event().wait()


async def test_a_client_without_limits_costs_one_transaction_per_flush_not_per_request(
        ) -> None:
    store = CountingStore()
    spend = ClientSpend(store, clock=FakeClock(T0), sleep=never)
    for _ in range(50):
        await _one(spend, FREE)
    assert store.transactions == 0 and len(spend.ledger) == 50  # admitted, queued
    rows = await spend.usage_rows()  # reading the ledger writes what waits first
    assert store.transactions == 1 and len(spend.ledger) == 0
    assert [(r["client"], r["requests"], r["prompt_tokens"], r["completion_tokens"])
            for r in rows] == [("free", 50, 200, 450)]
    assert [(r["name"], r["day_tokens"]) for r in await store.scan(CLIENTS)] == [
        ("free", 50 * 13)]  # its day's counter, as the store holds it


async def test_a_client_with_limits_pays_one_transaction_its_admission() -> None:
    """Its admission decides in the store and carries the settles queued before it: the
    tracker's own decisions always see its settles."""
    store = CountingStore()
    spend = ClientSpend(store, clock=FakeClock(T0), sleep=never)
    await _one(spend, BOB)
    assert store.transactions == 1 and len(spend.ledger) == 1  # the settle, queued
    await _one(spend, BOB)
    assert store.transactions == 2 and len(spend.ledger) == 1  # the first one's carried
    row = store.rows[("clients", "bob", 0)]
    assert row["day_tokens"] == 13 and len(row["inflight"]) == 1  # one settled, one not
    with pytest.raises(ClientRefused):  # rpm 2
        await spend.admit(BOB, parse_chat(BODY), _drop)
    assert [r["requests"] for r in await spend.usage_rows()] == [2]


async def test_a_budget_decides_on_the_settles_before_it() -> None:
    """A request's reservation (its worst case) is let go when it settles to the truth:
    the next admission on this tracker sees the truth, not the reservation."""
    tight = Client("tight", hashlib.sha256(b"tight").digest(), daily_tokens=13 + 34)
    body = parse_chat(BODY.replace(b'"model": "m"', b'"model": "m", "max_tokens": 20'))
    spend = ClientSpend(MemoryLimits(), clock=FakeClock(T0), sleep=never)
    for _ in range(2):  # each reserves 14 + 20 = 34 and settles to 13: both fit
        metered = await spend.admit(tight, body, _drop)
        await metered({"type": "http.response.start", "status": 200, "headers": []})
        await metered({"type": "http.response.body",
                       "body": b'{"usage": {"prompt_tokens": 4, "completion_tokens": 9}}'})
    with pytest.raises(ClientRefused):  # 26 spent + 34 reserved > 47
        await spend.admit(tight, body, _drop)


async def test_a_failed_flush_is_retried_until_the_store_takes_it() -> None:
    store = MemoryLimits()

    async def soon(_: float) -> None:  # the flusher's wait, without waiting it out
        await asyncio.sleep(0)

    spend = ClientSpend(store, clock=FakeClock(T0), sleep=soon)
    store.down = True
    for _ in range(3):
        await _one(spend, FREE)
    for _ in range(20):  # flushed and failed, again and again: kept
        await asyncio.sleep(0)
    assert len(spend.ledger) == 3 and spend.ledger.failures >= 2
    store.down = False
    for _ in range(200):
        if not spend.ledger:
            break
        await asyncio.sleep(0)
    assert not spend.ledger
    assert [r["requests"] for r in await store.usage(None, 0)] == [3]  # once each


async def test_at_shutdown_what_waits_is_flushed_or_logged_as_lost(
        caplog: pytest.LogCaptureFixture) -> None:
    for up, left in ((True, 0), (False, 2)):
        store = MemoryLimits()
        spend = ClientSpend(store, clock=FakeClock(T0), sleep=never)
        await _one(spend, FREE)
        await _one(spend, FREE)
        store.down = not up
        await spend.aclose()
        assert len(spend.ledger) == left
        store.down = False
        assert [r["requests"] for r in await store.usage(None, 0)] == ([2] if up else [])
    assert sum("usage of 2 requests is lost" in r.getMessage() for r in caplog.records) == 1


async def test_count_tokens_of_a_client_without_limits_is_recorded_behind() -> None:
    store = CountingStore()
    spend = ClientSpend(store, clock=FakeClock(T0), sleep=never)
    await spend.admit_free(FREE)
    await spend.check(FREE)  # nothing to check: no transaction
    assert store.transactions == 0
    assert [(r["route"], r["requests"]) for r in await spend.usage_rows()] == [(NO_ROUTE, 1)]


async def test_live_gates_decide_as_the_rows_store_does() -> None:
    """The same requests through LiveClients and through MemoryLimits (rows rebuilt per
    decision): the same answers, the same ledger and counters."""
    clock = FakeClock(T0)
    outcomes: list[tuple[Any, ...]] = []
    for store in (LiveClients(clock), MemoryLimits()):
        spend = ClientSpend(store, clock=clock, sleep=never)
        clock.now = T0
        refused = 0
        for i in range(7):
            try:
                await _one(spend, BOB, completion=i)
            except ClientRefused:
                refused += 1
            await _one(spend, FREE, completion=i)
            clock.advance(20)
        rows = sorted((r["client"], r["route"], r["requests"], r["completion_tokens"])
                      for r in await spend.usage_rows())
        counters = sorted((r["name"], r["day_tokens"], r["month_usd"])
                          for r in await store.scan(CLIENTS))
        outcomes.append((refused, rows, counters))
    assert outcomes[0] == outcomes[1]
    assert outcomes[0][0] > 0  # bob's rpm of 2 refused some


async def test_live_gates_hold_no_rows_of_other_gates() -> None:
    store = LiveClients()
    with pytest.raises(Exception, match="clients' gates only"):
        await store.transact([], lambda g: None, T0, 0)
    spend = ClientSpend(store, clock=FakeClock(T0), sleep=never)
    spend.ledger.add("free", None, Spent("m", 1, 2, 0.0, False), T0)
    assert [r["requests"] for r in await spend.usage_rows("free")] == [1]
    assert await store.scan("clients") and await store.scan("windows") == []


class CountingLive(LiveClients):
    """LiveClients that counts its transactions."""

    transactions = 0

    async def transact_with(self, rows: Sequence[RowName], make: Callable[[int], G],
                            op: Callable[[G], Any], now: float,
                            first_id: int) -> Outcome[Any]:
        self.transactions += 1
        return await super().transact_with(rows, make, op, now, first_id)


async def test_live_gates_decide_in_place_and_write_at_once() -> None:
    """One process's memory (no state file, no Redis): nothing is saved by waiting, so a
    request's end is on the live gates as soon as it ends (nothing queued, no flusher), and
    a limited client's admission decides on them with no transaction."""
    store = CountingLive(FakeClock(T0))
    spend = ClientSpend(store, clock=FakeClock(T0), sleep=never)
    await _one(spend, FREE)
    await _one(spend, BOB)
    assert len(spend.ledger) == 0 and store.transactions == 0
    assert sorted((r["client"], r["requests"], r["completion_tokens"])
                  for r in store.gates.ledger()) == [("bob", 1, 9), ("free", 1, 9)]
    await _one(spend, BOB)
    with pytest.raises(ClientRefused):  # rpm 2, decided on the live gates
        await spend.admit(BOB, parse_chat(BODY), _drop)
    assert store.transactions == 0

