"""Issue 24: `[[clients]]` loaded from --config with their keys read at start; with no
clients, a network listener serving provider routes refuses to start unless
--anonymous-clients, and then the start line and /v1/routing's warnings say so."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest

from meshroute_middleware.app.config import GatewayConfig, config_warnings, exposure
from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.services import background_services
from meshroute_middleware.app.settings import ServeSettings, SettingsError, load_settings
from meshroute_middleware.chat.keyring import KeyRefError
from meshroute_middleware.core.clients import ClientConfigError, key_digest, parse_clients
from meshroute_middleware.core.providers.config import parse_providers_config

from ..conftest import FakeClock
from ..upstream import serve_process

KEY = "mr-exposure-test-key-0123456789"
PROVIDERS = parse_providers_config({"providers": [
    {"name": "fastco", "base_url": "http://127.0.0.1:9/v1", "keys": ["env:FAST"],
     "models": [{"id": "big-model", "tier": "large"}]}]})
ENV = {"FAST": "sk-fast-secret", "ALICE_KEY": KEY}
ALICE = parse_clients([{"name": "alice", "key": "env:ALICE_KEY"}])
TOML = """
[[providers]]
name = "fastco"
base_url = "http://127.0.0.1:9/v1"
keys = ["env:FAST"]

[[providers.models]]
id = "big-model"
tier = "large"
"""
REFUSAL = "serves provider routes with no [[clients]]"
WARNING = "anyone who reaches the port can spend the provider keys"


def build(**settings: Any) -> GatewayConfig:
    base = ServeSettings(mdns=False, providers=PROVIDERS, state_file=":memory:")
    return GatewayConfig.build(replace(base, **settings), ENV)


def test_clients_load_from_the_config_file_and_their_keys_are_read_at_start(
        tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(TOML + '[[clients]]\nname = "alice"\nkey = "env:ALICE_KEY"\n'
                    'models = ["auto"]\nrpm = 10\n')
    settings = load_settings({"config": str(path), "state_file": ":memory:"}, {})
    assert [(c.name, c.key, c.models, c.rpm) for c in settings.clients] == [
        ("alice", "env:ALICE_KEY", ("auto",), 10)]
    config = GatewayConfig.build(replace(settings, mdns=False), ENV)
    assert [c.key_digest for c in config.clients] == [key_digest(KEY)]
    assert KEY not in repr(config)
    with pytest.raises(KeyRefError, match=r"\[\[clients\]\] 'alice': env:ALICE_KEY: the "
                                          "environment variable ALICE_KEY is not set"):
        GatewayConfig.build(replace(settings, mdns=False), {"FAST": "sk-fast-secret"})


def test_a_key_file_is_read_and_a_bad_table_names_the_file(tmp_path: Path) -> None:
    key_file = tmp_path / "alice.key"
    key_file.write_text(KEY + "\n")
    tables = parse_clients([{"name": "alice", "key": f"file:{key_file}"}])
    assert build(clients=tables).clients[0].key_digest == key_digest(KEY)
    path = tmp_path / "c.toml"
    path.write_text('[[clients]]\nname = "alice"\nkey = "mr-pasted"\n')
    with pytest.raises(SettingsError, match=r"c\.toml: \[\[clients\]\] 'alice': key must be"):
        load_settings({"config": str(path)}, {})


def test_a_network_listener_with_provider_routes_and_no_clients_is_refused() -> None:
    for host in ("0.0.0.0", "::", "192.168.1.20", "gateway.example"):
        with pytest.raises(ClientConfigError, match=re.escape(REFUSAL)):
            build(host=host)
    open_ = build(host="0.0.0.0", anonymous_clients=True)  # said out loud
    assert WARNING in exposure(open_)
    assert any(WARNING in w and w.startswith("anonymous-clients:")
               for w in config_warnings(open_))
    for config in (build(host="0.0.0.0", clients=ALICE), build(host="127.0.0.1"),
                   build(host="localhost"), build(host="0.0.0.0", providers=None)):
        assert config_warnings(config) == []
        assert WARNING not in exposure(config)
    assert "chat: client keys required (1 [[clients]])" in exposure(
        build(host="0.0.0.0", clients=ALICE))


def test_anonymous_clients_from_flag_env_and_file(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text("anonymous_clients = true\n")
    assert load_settings({"config": str(path)}, {}).anonymous_clients
    assert load_settings({}, {"MESHROUTE_ANONYMOUS_CLIENTS": "1"}).anonymous_clients
    assert load_settings({"anonymous_clients": True}, {}).anonymous_clients
    assert not load_settings({}, {}).anonymous_clients


@pytest.mark.anyio
async def test_the_start_line_and_v1_routing_warn(caplog: pytest.LogCaptureFixture) -> None:
    gw = build_gateway(build(host="0.0.0.0", anonymous_clients=True), clock=FakeClock())
    try:
        with caplog.at_level(logging.INFO, logger="meshroute.serve"):
            async with background_services(gw.config, gw.mesh):
                pass
        (opened,) = [r for r in caplog.records if r.getMessage().startswith("open: ")]
        assert WARNING in opened.getMessage() and opened.levelno == logging.WARNING
        transport = httpx.ASGITransport(app=gw.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as c:
            warnings = (await c.get("/v1/routing")).json()["config"]["warnings"]
        assert any(WARNING in w for w in warnings)
    finally:
        if gw.store is not None:
            gw.store.close()


def isolated() -> None:
    """Skip unless in scripts/isolated's network namespace: 0.0.0.0 there is loopback alone."""
    if os.environ.get("MESHROUTE_ISOLATED") != "1":
        pytest.skip("listens on 0.0.0.0: needs scripts/isolated (loopback only)")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_meshroute_serve_refuses_to_start_one_line_exit_2(tmp_path: Path,
                                                          workers: str) -> None:
    isolated()
    config = tmp_path / "c.toml"
    config.write_text(TOML)
    proc = subprocess.run(
        [sys.executable, "-m", "meshroute_middleware.app.cli", "serve", "--config", str(config),
         "--host", "0.0.0.0", "--port", "0", "--no-mdns", "--state-file", ":memory:",
         "--workers", workers], capture_output=True, text=True, timeout=60,
        env={**os.environ, **ENV})
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and REFUSAL in proc.stderr
    assert "--anonymous-clients" in proc.stderr and "Traceback" not in proc.stderr


def test_meshroute_serve_with_anonymous_clients_says_so(tmp_path: Path) -> None:
    isolated()
    config, log = tmp_path / "c.toml", tmp_path / "log"
    config.write_text(TOML)
    flags = ["--config", str(config), "--host", "0.0.0.0", "--state-file", ":memory:",
             "--anonymous-clients"]
    with serve_process(flags, log, ENV) as (url, _):
        warnings = httpx.get(f"{url}/v1/routing").json()["config"]["warnings"]
        assert any(WARNING in w for w in warnings)
        chat = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                          json={"model": "nothing", "messages": []})
        assert chat.status_code == 404  # open: no key asked for
    (opened,) = [line for line in log.read_text().splitlines() if "open: " in line]
    assert WARNING in opened
