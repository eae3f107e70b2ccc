"""The SQLite state store: open, write, close, reopen; kill -9; clear errors; no key inside."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from meshroute_middleware.chat.keyring import resolve_keys
from meshroute_middleware.core.providers.config import ProvidersConfig, parse_providers_config
from meshroute_middleware.core.providers.keys import Refusal
from meshroute_middleware.core.providers.router import ChainAttempt, ProviderRouter
from meshroute_middleware.core.providers.scoring import OutcomeKind
from meshroute_middleware.state.store import MEMORY, StateStore, StateStoreError

T0 = 1_796_040_000.0  # 2026-11-30 12:00 UTC
MIDNIGHT = T0 + 12 * 3600
KEYS = {"FASTCO_KEY_A": "sk-alpha-SECRET-111", "FASTCO_KEY_B": "sk-beta-SECRET-222"}
DOC = {"providers": [{"name": "fastco", "base_url": "http://127.0.0.1:9101/v1",
                      "keys": ["env:FASTCO_KEY_A", "env:FASTCO_KEY_B"], "rpd": 3,
                      "models": [{"id": "big-model", "tier": "large",
                                  "monthly_tokens": 1_000_000}]}]}


@pytest.fixture
def cfg() -> ProvidersConfig:
    return parse_providers_config(DOC)


def use(router: ProviderRouter, now: float, kind: OutcomeKind = OutcomeKind.SUCCESS) -> str:
    got = router.acquire(router.resolve("fastco/big-model", ()).candidates[0], 10, now)
    assert isinstance(got, ChainAttempt), got
    router.record(got, kind, now, used_tokens=100, tokens_per_s=50.0, ttfb_ms=300.0)
    return got.route


def test_open_write_close_reopen(tmp_path: Path, cfg: ProvidersConfig) -> None:
    path = tmp_path / "state.db"
    router = ProviderRouter(cfg)
    for i in range(4):
        use(router, T0 + i)
    router.record(ChainAttempt(router.resolve("fastco/big-model", ()).candidates[0], 2,
                          None), OutcomeKind.RATE_LIMITED, T0 + 5, retry_after_s=600.0)
    snap = router.snapshot(T0 + 5)
    with StateStore(path).open() as store:
        assert store.save(snap, T0 + 5) == 2 + 2 + 1  # 2 windows, 2 route keys, 1 stats row
    with StateStore(path) as store:
        loaded = store.load()
    again = ProviderRouter(cfg)
    again.restore(loaded)
    assert again.stats == router.stats
    assert again.snapshot(T0 + 5) == snap
    p = cfg.providers[0]
    assert again.gates.check(p, p.models[0], 1, 1, T0 + 6) is None  # 2 of 3 requests today
    assert again.gates.check(p, p.models[0], 2, 1, T0 + 6) == Refusal("cooldown", T0 + 605)


def test_a_restart_does_not_reset_the_daily_quota(tmp_path: Path,
                                                  cfg: ProvidersConfig) -> None:
    path = tmp_path / "state.db"
    router = ProviderRouter(cfg)
    routes = [use(router, T0 + i) for i in range(6)]  # 3 per key: both keys spent for today
    assert routes == ["fastco/big-model#1", "fastco/big-model#2"] * 3
    with StateStore(path).open() as store:
        store.save(router.snapshot(T0 + 6), T0 + 6)
    fresh = ProviderRouter(cfg)
    with StateStore(path).open() as store:
        fresh.restore(store.load())
    got = fresh.acquire(fresh.resolve("fastco/big-model", ()).candidates[0], 10, T0 + 7)
    assert isinstance(got, list) and {(p.reason, p.until) for p in got} == {("rpd", MIDNIGHT)}
    assert isinstance(fresh.acquire(fresh.resolve("fastco/big-model", ()).candidates[0], 10,
                                    MIDNIGHT), ChainAttempt)


def test_saving_again_updates_rows_in_place(tmp_path: Path, cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    with StateStore(tmp_path / "s.db").open() as store:
        use(router, T0)
        store.save(router.snapshot(T0), T0)
        use(router, T0 + 1)
        router.clear()
        store.save(router.snapshot(T0 + 1), T0 + 1)
        rows = store.load()
    windows = {r["key"]: r["day_requests"] for r in rows["windows"]}
    assert windows == {1: 1, 2: 1}
    assert len(rows["stats"]) == 1 and rows["stats"][0]["ok"] == 2.0


def test_memory_keeps_nothing(cfg: ProvidersConfig) -> None:
    router = ProviderRouter(cfg)
    use(router, T0)
    with StateStore(MEMORY).open() as store:
        store.save(router.snapshot(T0), T0)
        assert store.load()["windows"]
    with StateStore(MEMORY).open() as store:
        assert store.load() == {"windows": [], "keys": [], "stats": []}


def test_the_file_is_in_wal_mode_and_holds_no_key(tmp_path: Path,
                                                  cfg: ProvidersConfig) -> None:
    path = tmp_path / "state.db"
    secrets = resolve_keys(cfg, KEYS)["fastco"]
    router = ProviderRouter(cfg)
    use(router, T0)
    with StateStore(path).open() as store:
        store.save(router.snapshot(T0), T0)
        blob = b"".join(p.read_bytes() for p in tmp_path.iterdir())
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        columns = [r[1] for r in db.execute("PRAGMA table_info(route_state)")]
    assert columns == ["section", "name", "key_pos", "data", "updated_at"]
    for secret in secrets:
        assert secret.reveal().encode() not in blob
    assert b"FASTCO_KEY" not in blob


def test_state_survives_kill_9(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    writer = textwrap.dedent(f"""
        import sys, time
        from meshroute_middleware.core.providers.config import parse_providers_config
        from meshroute_middleware.core.providers.router import ProviderRouter
        from meshroute_middleware.state.store import StateStore
        router = ProviderRouter(parse_providers_config({DOC!r}))
        store = StateStore({str(path)!r}).open()
        c = router.resolve("fastco/big-model", ()).candidates[0]
        for i in range(3):
            router.gates.reserve(c.provider, c.model, 1, 10, {T0} + i)
        store.save(router.snapshot({T0} + 3), {T0} + 3)
        print("saved", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "saved"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert proc.returncode == -signal.SIGKILL
    with StateStore(path).open() as store:
        rows = store.load()
    assert [(r["name"], r["key"], r["day_requests"]) for r in rows["windows"]] == [
        ("fastco", 1, 3)]


@pytest.mark.parametrize("where", ["missing-dir/state.db", "a-directory"])
def test_a_file_that_cannot_be_opened(tmp_path: Path, where: str) -> None:
    (tmp_path / "a-directory").mkdir()
    path = tmp_path / where
    with pytest.raises(StateStoreError, match=f"cannot open state file {path}"):
        StateStore(path).open()


def test_a_file_that_is_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    path.write_bytes(b"this is not sqlite, it is a text file\n" * 200)
    with pytest.raises(StateStoreError, match="cannot open state file"):
        StateStore(path).open()


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    StateStore(path).open().close()
    with sqlite3.connect(path) as db:
        db.execute("UPDATE meta SET value = '99' WHERE name = 'schema_version'")
    with pytest.raises(StateStoreError, match="schema version 99"):
        StateStore(path).open()


def test_a_write_that_fails_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    store = StateStore(path).open()
    with sqlite3.connect(path) as other:  # another writer holds the lock past the timeout
        other.execute("BEGIN EXCLUSIVE")
        store._conn().execute("PRAGMA busy_timeout = 50")
        with pytest.raises(StateStoreError, match=f"cannot write state file {path}"):
            store.save({"stats": [{"name": "r", "key": 0, "ok": 1.0}]}, T0)
        other.execute("ROLLBACK")
    store.save({"stats": [{"name": "r", "key": 0, "ok": 1.0}]}, T0)  # and it recovers
    assert store.load()["stats"] == [{"name": "r", "key": 0, "ok": 1.0}]
    store.close()


def test_using_a_closed_store_is_an_error() -> None:
    with pytest.raises(StateStoreError, match="not open"):
        StateStore(MEMORY).load()


def test_an_unknown_section_is_refused() -> None:
    with StateStore(MEMORY).open() as store, pytest.raises(ValueError, match="unknown"):
        store.save({"secrets": [{"name": "x", "key": 1}]}, T0)
