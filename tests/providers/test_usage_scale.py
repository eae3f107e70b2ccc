"""`GET /v1/usage` on a Redis ledger of a year (issue 32, row 10): 20 clients x 20 routes x 375
UTC days = 150,000 rows, built directly in a real redis-server (pipelined, the layout of
state/redis_limits.py); a client's usage reads its own 7,500 rows through its index and
answers within 500 ms, a generous real-time bound for a loaded 2-core machine (the figures
measured are in docs/benchmarks.md)."""

from __future__ import annotations

import hashlib
import statistics
import time
from pathlib import Path

import httpx
import pytest
import redis

from meshroute_middleware.core.clients_budget import usage_row
from meshroute_middleware.state.limits import encode
from meshroute_middleware.state.redis_limits import (
    LEDGER_CLIENTS,
    LEDGER_INDEXED,
    ledger_index,
    redis_key,
)

from ..redis_server import redis_server
from ..upstream import serve_process
from .fake_provider import FakeProvider
from .gateway import ENV
from .test_shared_limits import config_text

CLIENTS, ROUTES, DAYS = 20, 20, 375
TODAY = int(time.time() // 86400)
BOUND_S = 0.5


def key_of(i: int) -> str:
    return f"client-{i:02d}-key-0123456789"


def build_ledger(url: str) -> None:
    with redis.Redis.from_url(url) as client:
        for c in range(CLIENTS):
            name = f"c{c:02d}"
            pipe = client.pipeline(transaction=False)
            index: dict[str, float] = {}
            for r in range(ROUTES):
                route = f"prov{r:02d}/model"
                for day in range(TODAY - DAYS + 1, TODAY + 1):
                    row = {"client": name, "route": route, "day": day, "requests": 2,
                           "prompt_tokens": 30, "completion_tokens": 7, "cost_usd": 0.001,
                           "errors": 0}
                    key = redis_key(usage_row(name, route, day))
                    pipe.set(key, encode(row), px=(day + 401) * 86_400_000
                             - int(time.time() * 1000))
                    index[key] = day
            pipe.zadd(ledger_index(name), index)
            pipe.sadd(LEDGER_CLIENTS, name)
            pipe.execute()
        client.set(LEDGER_INDEXED, "1")  # as a store this version wrote from the start
        assert client.dbsize() == CLIENTS * ROUTES * DAYS + CLIENTS + 2


def timed_get(url: str, key: str, **params: str) -> tuple[float, httpx.Response]:
    started = time.perf_counter()
    answer = httpx.get(f"{url}/v1/usage", params=params, timeout=30,
                       headers={"authorization": f"Bearer {key}"})
    return time.perf_counter() - started, answer


@pytest.mark.alone
def test_a_clients_usage_on_a_year_of_150k_rows_answers_within_500_ms(tmp_path: Path) -> None:
    clients = "".join(f'[[clients]]\nname = "c{i:02d}"\nkey = "sha256:'
                      f'{hashlib.sha256(key_of(i).encode()).hexdigest()}"\n'
                      for i in range(CLIENTS))
    admin = "admin-token-for-the-ledger"
    with redis_server(tmp_path) as server, FakeProvider("fast").serve() as fast:
        build_ledger(server.url)
        config = tmp_path / "meshroute.toml"
        config.write_text(config_text(fast) + clients)
        flags = ["--config", str(config), "--limits-store", server.url, "--state-file",
                 str(tmp_path / "state.db"), "--admin-token", admin, "--log-level", "warning"]
        with serve_process(flags, tmp_path / "log", ENV) as (url, _):
            own = [timed_get(url, key_of(7), group_by="route,day") for _ in range(5)]
            whole = timed_get(url, admin, group_by="client")
            month = timed_get(url, admin, group_by="client",
                              since=str((TODAY - 29) * 86400))
    for _, answer in own:
        assert answer.status_code == 200
        data = answer.json()["data"]
        assert len(data) == ROUTES * DAYS
        assert {r["requests"] for r in data} == {2}
    seconds = statistics.median(s for s, _ in own)
    print(f"\nGET /v1/usage, one client's 7,500 of 150,000 rows: median {seconds * 1000:.0f} ms"
          f" (of {', '.join(f'{s * 1000:.0f}' for s, _ in own)}); every client's, a year: "
          f"{whole[0] * 1000:.0f} ms; every client's, 30 days: {month[0] * 1000:.0f} ms")
    assert seconds < BOUND_S
    assert whole[1].status_code == 200
    assert [r["requests"] for r in whole[1].json()["data"]] == [2 * ROUTES * DAYS] * CLIENTS
    assert [r["requests"] for r in month[1].json()["data"]] == [2 * ROUTES * 30] * CLIENTS
