"""A burst of 200 concurrent requests against `meshroute serve --limits-store redis://…` on a
real redis-server (issue 32, rows 1 and 2): a busy connection pool is not an outage, so a
client's `rpm = 5` serves exactly 5 and the ledger shows what the provider received, a
provider key's `rpd = 20` receives at most 20, and `meshroute_limits_store_up` stays 1. And
a real outage (the store killed, with AOF): the client's rpm is held on the row last read,
and what was admitted meanwhile is written back."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..redis_server import redis_server
from ..upstream import serve_process
from .fake_provider import FakeProvider
from .gateway import ENV, HI
from .test_client_workers import wait_for
from .test_redis_trackers import store_up
from .test_shared_limits import config_text

BURST = 200
# A burst's 200 decisions on one row (the client's, the key's) take turns, each within the
# store's decision deadline, its turn included (state/redis_limits.py DECISION_DEADLINE_S,
# 5 s): the whole burst took 1.5-2.3 s at load 10-11 on 2 cores (2026-12-07), so at load 20-33
# the last ones can run out and be taken for an outage (store_up 0). That a burst is decided
# within the deadline is the claim: the two bursts run alone (.ci/run's `alone` group).
KEY = "burst-client-key-0123456789"
ADMIN = "admin-token-for-the-burst"


async def burst(url: str, headers: dict[str, str]) -> tuple[list[int], list[float]]:
    """BURST requests at once, /metrics polled meanwhile: status codes, store_up readings."""
    limits = httpx.Limits(max_connections=BURST + 8, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=60, limits=limits) as http:
        async def one() -> int:
            answer = await http.post(f"{url}/v1/chat/completions", headers=headers,
                                     json={"model": "fastco/big-model", "messages": HI})
            return answer.status_code

        async def watch(done: asyncio.Event) -> list[float]:
            seen = []
            while not done.is_set():
                seen.append(await asyncio.to_thread(store_up, url))
                await asyncio.sleep(0.05)
            return seen

        done = asyncio.Event()
        watcher = asyncio.create_task(watch(done))
        codes = await asyncio.gather(*(one() for _ in range(BURST)))
        done.set()
        ups = await watcher
    return list(codes), [*ups, store_up(url)]


def ledger(url: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{url}/v1/usage", headers={"authorization": f"Bearer {ADMIN}"},
                       timeout=10)
    data: list[dict[str, Any]] = answer.json()["data"]
    return data


def gateway_flags(tmp: Path, text: str, store: str) -> list[str]:
    config = tmp / "meshroute.toml"
    config.write_text(text)
    return ["--config", str(config), "--limits-store", store, "--state-file",
            str(tmp / "state.db"), "--admin-token", ADMIN, "--log-level", "warning"]


@pytest.mark.alone
def test_a_burst_of_200_at_rpm_5_serves_5_and_the_ledger_shows_them(tmp_path: Path) -> None:
    client = (f'[[clients]]\nname = "alice"\nkey = "sha256:'
              f'{hashlib.sha256(KEY.encode()).hexdigest()}"\nrpm = 5\n')
    with redis_server(tmp_path) as server, FakeProvider("fast").serve() as fast:
        flags = gateway_flags(tmp_path, config_text(fast) + client, server.url)
        with serve_process(flags, tmp_path / "log", ENV) as (url, _):
            codes, ups = asyncio.run(burst(url, {"authorization": f"Bearer {KEY}"}))
            # a request is recorded once its answer has ended (chat/spend.py)
            wait_for(lambda: sum(r["requests"] for r in ledger(url)) >= 5)
            usage = ledger(url)
    assert codes.count(200) == 5, sorted(set(codes))
    assert codes.count(429) == BURST - 5
    assert len(fast.seen) == 5
    assert [(r["client"], r["requests"]) for r in usage] == [("alice", 5)]
    assert ups and set(ups) == {1.0}
    assert "limits store" not in (tmp_path / "log").read_text()


@pytest.mark.alone
def test_a_burst_of_200_on_a_key_with_rpd_20_sends_at_most_20(tmp_path: Path) -> None:
    with redis_server(tmp_path) as server, FakeProvider("fast").serve() as fast:
        flags = gateway_flags(tmp_path, config_text(fast, rpd=20), server.url)
        with serve_process(flags, tmp_path / "log", ENV) as (url, _):
            codes, ups = asyncio.run(burst(url, {}))
    assert len(fast.seen) <= 20
    assert codes.count(200) == len(fast.seen) == 20
    assert ups and set(ups) == {1.0}


def test_a_client_through_a_store_outage_keeps_its_rpm_and_its_ledger(tmp_path: Path) -> None:
    client = (f'[[clients]]\nname = "alice"\nkey = "sha256:'
              f'{hashlib.sha256(KEY.encode()).hexdigest()}"\nrpm = 5\n')
    headers = {"authorization": f"Bearer {KEY}"}
    body = {"model": "fastco/big-model", "messages": HI}
    with redis_server(tmp_path, aof=True) as server, FakeProvider("fast").serve() as fast:
        flags = gateway_flags(tmp_path, config_text(fast) + client, server.url)
        with serve_process(flags, tmp_path / "log", ENV) as (url, _):
            def post() -> int:
                return httpx.post(f"{url}/v1/chat/completions", headers=headers, json=body,
                                  timeout=30).status_code

            assert [post() for _ in range(3)] == [200] * 3
            wait_for(lambda: sum(r["requests"] for r in ledger(url)) == 3)
            server.stop()
            during = [post() for _ in range(5)]  # on the row last read: 3 of 5 used
            gone = httpx.get(f"{url}/v1/usage", headers={"authorization": f"Bearer {ADMIN}"},
                             timeout=10)
            server.start()  # with its data (AOF)
            wait_for(lambda: httpx.get(f"{url}/v1/usage", timeout=10, headers={
                "authorization": f"Bearer {ADMIN}"}).status_code == 200)
            after = post()
            usage = ledger(url)
    assert during == [200, 200, 429, 429, 429]
    assert gone.status_code == 503 and gone.json()["error"]["code"] == "limits_store_unavailable"
    assert after == 429  # the 2 admitted meanwhile were written back: 5 in the minute
    assert [(r["client"], r["requests"]) for r in usage] == [("alice", 5)]
    assert len(fast.seen) == 5
