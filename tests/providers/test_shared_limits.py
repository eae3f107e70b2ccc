"""`meshroute serve --workers N` as real processes: one provider budget, exactly (issue 23).

The workers share the key gates through the state file: a key with `rpm = 10` receives at most
10 requests whatever N; a 429's cooldown and a 401's revocation learned by one worker hold in
all; a clear sent to one worker reinstates the key in all. Few and bounded: worker processes
are heavy on a small machine."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from ..upstream import serve_process
from .fake_provider import FakeProvider, Reply
from .gateway import ENV, HI

PATIENCE_S = 60.0  # for every worker to be up, on a loaded 2-core machine


def config_text(fast: FakeProvider, auth: FakeProvider | None = None, **limits: int) -> str:
    lines = ["[[providers]]", 'name = "fastco"', f'base_url = "{fast.base_url}"',
             'keys = ["env:FAST_A"]', *(f"{k} = {v}" for k, v in limits.items()),
             "[[providers.models]]", 'id = "big-model"', 'tier = "large"']
    if auth is not None:
        lines += ["[[providers]]", 'name = "authco"', f'base_url = "{auth.base_url}"',
                  'keys = ["env:SLOW_A"]', "[[providers.models]]", 'id = "small-model"',
                  'tier = "small"']
    return "\n".join(lines) + "\n"


@contextmanager
def workers(tmp: Path, text: str, n: int) -> Iterator[str]:
    config = tmp / "meshroute.toml"
    config.write_text(text)
    flags = ["--config", str(config), "--state-file", str(tmp / "state.db"),
             "--log-level", "warning", "--gossip-interval", "0.5"]
    if n > 1:
        flags += ["--workers", str(n)]
    with serve_process(flags, tmp / "log", ENV) as (url, _):
        seen: set[str] = set()
        deadline = time.monotonic() + PATIENCE_S
        while len(seen) < n:  # every new connection lands on one of the started workers
            assert time.monotonic() < deadline, f"only {sorted(seen)} of {n} workers answer"
            try:
                seen.add(httpx.get(f"{url}/healthz", timeout=5).json()["tracker"])
            except httpx.TransportError:
                time.sleep(0.1)
        yield url


def chat(url: str, model: str = "fastco/big-model") -> httpx.Response:
    """One request on a connection of its own (so the kernel spreads them over workers)."""
    return httpx.post(f"{url}/v1/chat/completions", timeout=30,
                      json={"model": model, "messages": HI})


@pytest.mark.parametrize("n", [1, 2, 4])
def test_rpm_10_is_10_requests_whatever_the_workers(n: int, tmp_path: Path) -> None:
    with FakeProvider("fast").serve() as fast, workers(tmp_path, config_text(fast, rpm=10),
                                                       n) as url:
        answers = [chat(url) for _ in range(20)]
        assert len(fast.seen) == 10
        assert [a.status_code for a in answers].count(200) == 10
        for limited in (a for a in answers if a.status_code != 200):
            assert limited.status_code == 429
            error = limited.json()["error"]
            assert error["code"] == "rate_limited"
            assert {r["reason"] for r in error["routes"]} == {"rpm"}
            assert 1 <= int(limited.headers["retry-after"]) <= 61
        keys = httpx.get(f"{url}/v1/routing/chain",
                         params={"model": "fastco/big-model"}).json()["chain"][0]["keys"]
        assert keys[0]["limits"] == ("state-file" if n > 1 else "local")


def test_a_cooldown_and_a_revocation_hold_in_every_worker_and_a_clear_ends_them(
        tmp_path: Path) -> None:
    fast = FakeProvider("fast", script=[Reply.rate_limited("30")])
    auth = FakeProvider("auth", models=("small-model",), default=Reply.error(401))
    with fast.serve(), auth.serve(), workers(tmp_path, config_text(fast, auth), 2) as url:
        first = chat(url)
        assert first.status_code == 429  # the provider's 429; its one key now cools 30 s
        later = [chat(url) for _ in range(8)]
        assert len(fast.seen) == 1  # no worker sent to the cooling key
        assert all(a.status_code == 429 for a in later)
        assert all({r["reason"] for r in a.json()["error"]["routes"]} == {"cooldown"}
                   for a in later)
        assert all(int(a.headers["retry-after"]) > 20 for a in later)

        assert chat(url, "authco/small-model").status_code == 502  # 401: the key is revoked
        benched = [chat(url, "authco/small-model") for _ in range(8)]
        assert len(auth.seen) == 1  # no worker used the revoked key again
        assert all(a.status_code == 502 for a in benched)  # refused keys: never a 429
        assert all({r["reason"] for r in a.json()["error"]["routes"]} == {"revoked"}
                   for a in benched)
        auth.default = Reply.ok()  # the operator replaced the key's grant
        cleared = httpx.post(f"{url}/v1/cooldowns/clear", json={"route": "authco/small-model"})
        assert cleared.status_code == 200 and cleared.json()["cleared"] == 1
        back = [chat(url, "authco/small-model") for _ in range(8)]
        assert [a.status_code for a in back] == [200] * 8  # in every worker
        assert len(auth.seen) == 9


def test_workers_cannot_share_limits_in_memory(tmp_path: Path) -> None:
    with FakeProvider("fast").serve() as fast:
        config = tmp_path / "meshroute.toml"
        config.write_text(config_text(fast, rpm=10))
        proc = subprocess.run(
            [sys.executable, "-m", "meshroute_middleware.app.cli", "serve", "--config",
             str(config), "--no-mdns", "--workers", "2", "--state-file", ":memory:"],
            capture_output=True, text=True, env={**os.environ, **ENV}, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "':memory:' cannot be shared" in proc.stderr
