"""Clients' limits and budgets held across processes (the state file, `BEGIN IMMEDIATE`) and
across trackers (Redis): each process its own store connection and its own ClientSpend,
all admitting at once, and the totals are the limits, never more (issue 24)."""

from __future__ import annotations

import asyncio
import hashlib
import multiprocessing
from pathlib import Path
from typing import Any

from meshroute_middleware.chat.spend import ClientSpend
from meshroute_middleware.core.clients import Client
from meshroute_middleware.http.errors import RequestError
from meshroute_middleware.http.request import ChatRequest
from meshroute_middleware.state.limits import LimitsStore
from meshroute_middleware.state.sqlite_limits import SqliteLimits
from meshroute_middleware.state.store import StateStore

T0 = 1_796_040_000.0
# reserves 5 + 25 = 30 tokens, what each answer then uses (10 + 20): with the estimate
# exact, what is in flight at once can never push the total past a budget
BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 25}'
CLIENTS = {"rpm": Client("alice", hashlib.sha256(b"k").digest(), rpm=25),
           # 10 answers of 30 tokens fit, not 11
           "daily": Client("alice", hashlib.sha256(b"k").digest(), daily_tokens=300),
           # issue 32: each request's worst case, 30 tokens at 1,000 USD per million, is held
           # while in flight: a budget of 1.5 of them lets one in across every process
           "usd": Client("alice", hashlib.sha256(b"k").digest(), monthly_usd=0.045)}
PRICES = {"p/m": (1000.0, 1000.0)}
ATTEMPTS = 40  # per process: more than the limit alone
PROCESSES = 2


async def _noop(message: Any) -> None:
    return None


async def spend_all(store: LimitsStore, kind: str) -> tuple[int, int]:
    """Try ATTEMPTS requests of CLIENTS[kind] at T0, each answered with usage 10 + 20
    tokens (for "usd": admitted and left in flight): (admitted, refused)."""
    spend = ClientSpend(store, PRICES, clock=lambda: T0)
    admitted = refused = 0
    for _ in range(ATTEMPTS):
        try:
            send = await spend.admit(CLIENTS[kind], ChatRequest(BODY, "p/m", None), _noop)
        except RequestError:
            refused += 1
            continue
        admitted += 1
        if kind == "usd":
            continue
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"), (b"x-meshroute-route", b"p/m#1")]})
        await send({"type": "http.response.body", "more_body": False,
                    "body": b'{"usage": {"prompt_tokens": 10, "completion_tokens": 20}}'})
    return admitted, refused


def _sqlite_worker(path: str, kind: str, start: Any, out: Any) -> None:
    store = SqliteLimits(path).open()
    start.wait(30)
    out.put(asyncio.run(spend_all(store, kind)))


def _redis_worker(url: str, kind: str, start: Any, out: Any) -> None:
    from meshroute_middleware.state.redis_limits import RedisLimits

    async def run() -> tuple[int, int]:
        store = RedisLimits(url, timeout_s=5.0)
        try:
            return await spend_all(store, kind)
        finally:
            await store.close()
    start.wait(30)
    out.put(asyncio.run(run()))


def run_processes(target: Any, arg: str, kind: str) -> list[tuple[int, int]]:
    ctx = multiprocessing.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=target, args=(arg, kind, start, out))
             for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    start.set()  # every process admits at once
    results = [out.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    return results


def fresh_state_file(tmp_path: Path) -> str:
    path = str(tmp_path / "state.db")
    StateStore(path).open().close()  # the schema, as `meshroute serve` creates it
    return path


def test_two_processes_on_one_state_file_hold_one_rpm_and_one_ledger(tmp_path: Path) -> None:
    path = fresh_state_file(tmp_path)
    results = run_processes(_sqlite_worker, path, "rpm")
    assert sum(a for a, _ in results) == 25
    assert sum(r for _, r in results) == PROCESSES * ATTEMPTS - 25
    rows = asyncio.run(ClientSpend(SqliteLimits(path).open()).usage_rows())
    assert [(r["client"], r["route"], r["requests"], r["prompt_tokens"],
             r["completion_tokens"]) for r in rows] == [("alice", "p/m", 25, 250, 500)]


def test_two_processes_on_one_state_file_hold_one_daily_budget(tmp_path: Path) -> None:
    results = run_processes(_sqlite_worker, fresh_state_file(tmp_path), "daily")
    assert sum(a for a, _ in results) == 10


def test_two_processes_on_one_state_file_hold_each_requests_worst_usd_in_flight(
        tmp_path: Path) -> None:
    results = run_processes(_sqlite_worker, fresh_state_file(tmp_path), "usd")
    assert sum(a for a, _ in results) == 1


def test_two_trackers_on_one_redis_hold_each_requests_worst_usd_in_flight(
        tmp_path: Path) -> None:
    from tests.redis_server import RedisServer
    server = RedisServer(tmp_path).start()
    try:
        results = run_processes(_redis_worker, server.url, "usd")
    finally:
        server.stop()
    assert sum(a for a, _ in results) == 1


def test_two_trackers_on_one_redis_hold_one_rpm_and_one_ledger(tmp_path: Path) -> None:
    from meshroute_middleware.state.redis_limits import RedisLimits
    from tests.redis_server import RedisServer
    server = RedisServer(tmp_path).start()
    try:
        results = run_processes(_redis_worker, server.url, "rpm")

        async def ledger() -> list[dict[str, Any]]:
            store = RedisLimits(server.url, timeout_s=5.0)
            try:
                return await ClientSpend(store).usage_rows()
            finally:
                await store.close()
        rows = asyncio.run(ledger())
    finally:
        server.stop()
    assert sum(a for a, _ in results) == 25
    assert [(r["client"], r["route"], r["requests"], r["completion_tokens"])
            for r in rows] == [("alice", "p/m", 25, 500)]


def test_redis_rows_of_clients_expire_after_their_month_and_the_ledger_after_retention() -> None:
    from meshroute_middleware.core.clients_budget import Admission, ClientGates, Spent
    from meshroute_middleware.state.redis_limits import expiry_s

    gates = ClientGates()
    admission = gates.admit(CLIENTS["rpm"], 10, T0)
    assert isinstance(admission, Admission)
    gates.settle(admission, Spent("p/m", 1, 1, 0.0, False), T0)
    rows = gates.snapshot(T0)
    month_end = 1_796_083_200.0  # 2026-12-01 00:00 UTC: T0 is in November
    assert expiry_s("clients", rows["clients"][0], T0) == month_end - T0
    kept = (rows["usage"][0]["key"] + 1 + 400) * 86400.0 - T0  # 400 days after its day
    assert expiry_s("usage", rows["usage"][0], T0) == kept
    assert expiry_s("usage", rows["usage"][0], T0, retention_days=30) == kept - 370 * 86400
