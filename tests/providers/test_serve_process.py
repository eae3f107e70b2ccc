"""`meshroute serve --config FILE` as a real process: the official openai client, restart
persistence (killed, restarted: the daily counter holds), and no key in any log or response."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from ..upstream import serve_process
from .fake_provider import FakeProvider
from .gateway import ENV, HI, assert_no_key_in

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "providers" / "meshroute.toml"
PATIENCE_S = 30.0  # what must happen, on a loaded 2-core machine


def config_text(fast: FakeProvider, slow: FakeProvider, rpd: int = 1000) -> str:
    """The example config, with the fake providers' addresses and env names."""
    text = EXAMPLE.read_text()
    text = text.replace("http://127.0.0.1:9101/v1", fast.base_url)
    text = text.replace("http://127.0.0.1:9102/v1", slow.base_url)
    text = text.replace("FASTCO_KEY_A", "FAST_A").replace("FASTCO_KEY_B", "FAST_B")
    text = text.replace("SLOWCO_KEY", "SLOW_A").replace("rpd = 1000", f"rpd = {rpd}")
    return text


@contextmanager
def serve(config: Path, state: Path, log: Path, **env: str) -> Iterator[str]:
    flags = ["--config", str(config), "--state-file", str(state), "--log-level", "debug"]
    with serve_process(flags, log, {**ENV, **env}) as (url, _):
        yield url


def saved_day_requests(state: Path, name: str, key: int) -> int:
    with sqlite3.connect(f"file:{state}?mode=ro", uri=True) as db:
        row = db.execute("SELECT data FROM route_state WHERE section = 'windows' AND "
                         "name = ? AND key_pos = ?", (name, key)).fetchone()
    return 0 if row is None else int(json.loads(row[0])["day_requests"])


def test_openai_client_restart_persistence_and_no_key_anywhere(
        providers: tuple[FakeProvider, FakeProvider], tmp_path: Path) -> None:
    fast, slow = providers
    config, state, log = tmp_path / "meshroute.toml", tmp_path / "state.db", tmp_path / "log"
    config.write_text(config_text(fast, slow, rpd=1))
    seen: list[str] = []
    with serve(config, state, log) as url:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="client-own-key", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(
            model="fastco/big-model", messages=HI)  # type: ignore[arg-type]
        completion = raw.parse()
        assert raw.headers["x-meshroute-route"] == "fastco/big-model#1"
        assert completion.choices[0].message.content == " ".join(f"t{i}" for i in range(8))
        assert completion.usage is not None and completion.usage.total_tokens == 13
        chunks: list[Any] = list(client.chat.completions.create(
            model="fastco/big-model", messages=HI, stream=True))  # type: ignore[arg-type]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "".join(f"t{i} " for i in range(8))
        # both keys spent their rpd = 1: the chain falls to slowco, the pin to a 429
        auto = client.chat.completions.with_raw_response.create(
            model="auto", messages=HI)  # type: ignore[arg-type]
        assert auto.headers["x-meshroute-route"] == "slowco/small-model#1"
        with pytest.raises(openai.RateLimitError) as limited:
            client.chat.completions.create(model="fastco/big-model",
                                           messages=HI)  # type: ignore[arg-type]
        body: Any = limited.value.body
        assert body["code"] == "rate_limited"
        assert {r["reason"] for r in body["routes"]} == {"rpd"}
        assert int(limited.value.response.headers["retry-after"]) >= 1
        seen += [json.dumps(body), limited.value.response.text]
        for model in ("auto", "auto:fastest", "fastco/big-model"):
            seen.append(httpx.get(f"{url}/v1/routing/chain", params={"model": model}).text)
        seen += [httpx.get(f"{url}/metrics").text, httpx.get(f"{url}/v1/routing").text]
        deadline = time.monotonic() + PATIENCE_S  # saved off the request path, ~every 0.25 s
        while saved_day_requests(state, "fastco", 2) < 1:
            assert time.monotonic() < deadline, "the state was never saved"
            time.sleep(0.05)
    assert len(fast.seen) == 2
    assert {s.key for s in fast.seen} == {ENV["FAST_A"], ENV["FAST_B"]}
    assert all("client-own-key" not in json.dumps(s.headers) for s in fast.seen)
    with serve(config, state, log) as url:  # killed and restarted: the daily quota holds
        again = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                           json={"model": "fastco/big-model", "messages": HI})
        seen.append(again.text)
        assert again.status_code == 429
        assert {r["reason"] for r in again.json()["error"]["routes"]} == {"rpd"}
    assert len(fast.seen) == 2  # nothing sent after the restart
    logged = log.read_text()
    assert "fastco/big-model#1" in logged or "2 provider(s)" in logged
    assert_no_key_in(logged, *seen, state.read_bytes().decode("latin-1"))
    wal = tmp_path / "state.db-wal"
    if wal.exists():
        assert_no_key_in(wal.read_bytes().decode("latin-1"))


def test_a_missing_key_is_a_clear_error_and_exit_2(
        providers: tuple[FakeProvider, FakeProvider], tmp_path: Path) -> None:
    fast, slow = providers
    config = tmp_path / "meshroute.toml"
    config.write_text(config_text(fast, slow))
    env = {k: v for k, v in {**os.environ, **ENV}.items() if k != "SLOW_A"}
    proc = subprocess.run(
        [sys.executable, "-m", "meshroute_middleware.app.cli", "serve", "--config",
         str(config), "--no-mdns", "--state-file", ":memory:"],
        capture_output=True, text=True, env=env, timeout=60)
    assert proc.returncode == 2
    assert "env:SLOW_A" in proc.stderr and "slowco" in proc.stderr
    assert_no_key_in(proc.stderr, proc.stdout)


def test_a_literal_key_in_the_config_is_refused_without_echoing_it(
        providers: tuple[FakeProvider, FakeProvider], tmp_path: Path) -> None:
    fast, slow = providers
    config = tmp_path / "meshroute.toml"
    config.write_text(config_text(fast, slow).replace('"env:SLOW_A"', f'"{ENV["SLOW_A"]}"'))
    proc = subprocess.run(
        [sys.executable, "-m", "meshroute_middleware.app.cli", "serve", "--config",
         str(config), "--no-mdns", "--state-file", ":memory:"],
        capture_output=True, text=True, env={**os.environ, **ENV}, timeout=60)
    assert proc.returncode == 2
    assert "keys" in proc.stderr
    assert_no_key_in(proc.stderr, proc.stdout)
