"""`meshroute limits migrate --from state-file --to redis://…` (issue 32, row 11), with real
processes: a gateway on a state file spends a client's daily budget and half of a provider
key's rpd; the state file is moved into a real redis-server; a gateway on that Redis goes on
from there (the budget still spent, the ledger whole, the key's day counted), where without
the move every budget would start from zero."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import httpx

from ..redis_server import redis_server
from ..upstream import serve_process
from .fake_provider import FakeProvider
from .gateway import ENV, HI
from .test_client_workers import wait_for
from .test_serve_process import config_text, saved_day_requests

ALICE, BOB = "alice-secret-key-0123456789", "bob-secret-key-0123456789"
ADMIN = "admin-token-for-the-move"


def clients() -> str:
    return "".join(f'\n[[clients]]\nname = "{name}"\nkey = "sha256:'
                   f'{hashlib.sha256(key.encode()).hexdigest()}"\n{limit}'
                   for name, key, limit in (("alice", ALICE, "daily_tokens = 30\n"),
                                            ("bob", BOB, "")))


def chat(url: str, key: str) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=30,
                      headers={"authorization": f"Bearer {key}"},
                      json={"model": "fastco/big-model", "messages": HI, "max_tokens": 1})


def usage(url: str) -> list[tuple[str, int, int]]:
    data = httpx.get(f"{url}/v1/usage", headers={"authorization": f"Bearer {ADMIN}"},
                     timeout=10).json()["data"]
    return [(r["client"], r["requests"], r["prompt_tokens"] + r["completion_tokens"])
            for r in data]


def migrate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshroute_middleware.app.cli", "limits",
                           "migrate", *args], capture_output=True, text=True, timeout=60)


def test_migrate_moves_budgets_windows_and_the_ledger_into_redis(
        providers: tuple[FakeProvider, FakeProvider], tmp_path: Path) -> None:
    fast, slow = providers
    config = tmp_path / "meshroute.toml"
    config.write_text(config_text(fast, slow, rpd=2) + clients())  # 2 keys x rpd 2
    state = tmp_path / "state.db"
    flags = ["--config", str(config), "--admin-token", ADMIN, "--log-level", "warning"]
    with serve_process([*flags, "--state-file", str(state)], tmp_path / "a.log", ENV) as (
            url, _):
        assert [chat(url, ALICE).status_code for _ in range(2)] == [200, 200]
        wait_for(lambda: usage(url) == [("alice", 2, 26)])  # the ledger: written per request
        wait_for(lambda: saved_day_requests(state, "fastco", 1)
                 + saved_day_requests(state, "fastco", 2) == 2)  # the keys: every 0.25 s
    with redis_server(tmp_path) as server:
        moved = migrate("--from", "state-file", "--to", server.url, "--state-file",
                        str(state))
        assert moved.returncode == 0, moved.stderr
        assert "6 rows moved" in moved.stdout  # 2 key windows, 2 key months, alice, ledger
        again = migrate("--from", "state-file", "--to", server.url, "--state-file",
                        str(state))
        assert "0 rows moved" in again.stdout and "6 already in the store" in again.stdout
        with serve_process([*flags, "--limits-store", server.url, "--state-file",
                            str(tmp_path / "b.db")], tmp_path / "b.log", ENV) as (url, _):
            refused = chat(url, ALICE)
            assert usage(url) == [("alice", 2, 26)]
            bob = [chat(url, BOB).status_code for _ in range(4)]
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "budget_exceeded"
    assert bob == [200, 200, 429, 429]  # the keys' 2 of 4 for the day were moved too
    assert len(fast.seen) == 4


def test_migrate_refuses_what_it_cannot_do_in_one_line(tmp_path: Path) -> None:
    missing = migrate("--from", "state-file", "--to", "redis://127.0.0.1:1/0",
                      "--state-file", str(tmp_path / "none.db"))
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    wrong = migrate("--from", "state-file", "--to", "http://x", "--state-file",
                    str(tmp_path / "none.db"))
    assert wrong.returncode == 2 and "redis://" in wrong.stderr
    assert len(wrong.stderr.strip().splitlines()) == 1
    unknown = migrate("--from", "postgres", "--to", "redis://127.0.0.1:1/0")
    assert unknown.returncode == 2 and "invalid choice" in unknown.stderr
