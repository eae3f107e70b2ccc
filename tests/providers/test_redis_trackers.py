"""Two `meshroute serve` processes sharing `--limits-store redis://…` on a real redis-server:
one budget across trackers; the store killed mid-run: each tracker keeps serving within its
share of what was left (`meshroute_limits_store_up 0`); the store back, empty: what was sent
meanwhile is written back, and the budget is exact again (issues 23, 32)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from ..redis_server import redis_server
from ..upstream import free_port, serve_process
from .fake_provider import FakeProvider
from .gateway import ENV
from .test_shared_limits import chat, config_text

PATIENCE_S = 30.0


def store_up(url: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    found = re.search(r'^meshroute_limits_store_up\{store="redis"\} (\S+)$', text, re.M)
    assert found is not None, "no meshroute_limits_store_up on /metrics"
    return float(found.group(1))


def served(urls: list[str], each: int) -> list[int]:
    """`each` requests to every tracker, interleaved; how many each tracker answered 200."""
    ok = [0] * len(urls)
    for _ in range(each):
        for i, url in enumerate(urls):
            ok[i] += chat(url).status_code == 200
    return ok


@pytest.mark.alone
def test_two_trackers_one_budget_a_share_while_the_store_is_gone(tmp_path: Path) -> None:
    with redis_server(tmp_path) as server, FakeProvider("fast").serve() as fast:
        config = tmp_path / "meshroute.toml"
        config.write_text(config_text(fast, rpm=20))
        flags = ["--config", str(config), "--limits-store", server.url, "--log-level",
                 "warning"]
        with serve_process([*flags, "--state-file", str(tmp_path / "a.db")],
                           tmp_path / "a.log", ENV) as (a, _), \
                serve_process([*flags, "--state-file", str(tmp_path / "b.db")],
                              tmp_path / "b.log", ENV) as (b, _):
            assert served([a, b], 1) == [1, 1]
            time.sleep(1.5)  # a heartbeat later each tracker counts both
            assert served([a, b], 4) == [4, 4]  # 10 of the 20, over both trackers
            assert len(fast.seen) == 10
            keys = httpx.get(f"{a}/v1/routing/chain",
                             params={"model": "fastco/big-model"}).json()["chain"][0]["keys"]
            assert keys[0]["limits"] == "redis"
            metrics = httpx.get(f"{a}/metrics", timeout=10).text
            timed = re.search(r"^meshroute_limits_store_seconds_count (\S+)$", metrics, re.M)
            assert timed is not None and float(timed.group(1)) >= 7  # takes and settles
            assert re.search(r"^meshroute_limits_trackers 2\.0$", metrics, re.M)

            server.stop()
            assert served([a, b], 3) == [3, 3]  # no request fails because the store is gone
            deadline = time.monotonic() + PATIENCE_S  # /metrics is cached for a second
            while store_up(a) != 0 or store_up(b) != 0:
                assert time.monotonic() < deadline, "meshroute_limits_store_up stayed 1"
                time.sleep(0.2)
            keys = httpx.get(f"{a}/v1/routing/chain",
                             params={"model": "fastco/big-model"}).json()["chain"][0]["keys"]
            assert keys[0]["limits"] == "local"  # its own share, while the store is away
            # each tracker: half of the 10 the store had left when it last read it
            assert served([a, b], 4) == [2, 2]
            assert len(fast.seen) == 20
            logged = (tmp_path / "a.log").read_text()
            assert logged.count("limits store (redis) failed") == 1

            server.start()  # empty (no persistence): what the trackers sent is written back
            deadline = time.monotonic() + PATIENCE_S
            while store_up(a) == 0 or store_up(b) == 0:
                assert time.monotonic() < deadline, "the trackers never went back to the store"
                served([a, b], 1)
                time.sleep(0.3)
            served([a, b], 8)
            # exactly 10 more in all: the 10 sent while the store was away were written back
            # to it, and it holds one budget of 20 for both again
            assert len(fast.seen) - 20 == 10


def test_an_unreachable_store_at_start_is_one_line_and_exit_2(tmp_path: Path) -> None:
    with FakeProvider("fast").serve() as fast:
        config = tmp_path / "meshroute.toml"
        config.write_text(config_text(fast, rpm=10) + '[limits]\nstore = "redis://127.0.0.1:'
                          f'{free_port()}/0"\n')
        proc = subprocess.run(
            [sys.executable, "-m", "meshroute_middleware.app.cli", "serve", "--config",
             str(config), "--no-mdns", "--state-file", ":memory:"],
            capture_output=True, text=True, env={**os.environ, **ENV}, timeout=60)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--limits-store redis://127.0.0.1:" in lines[0], proc.stderr
    assert "does not answer" in lines[0]
