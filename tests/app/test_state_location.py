"""Where the state file lives by default (the user's state directory, XDG base directories)
and that the gateway creates it 0600 in 0700 directories; `--state-file` still overrides."""

from __future__ import annotations

import os
import signal
import sqlite3
import stat
import sys
from pathlib import Path

import pytest

from meshroute_middleware.app.config import GatewayConfig
from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import load_settings
from tests.upstream import serve_process

PROVIDERS = """
[routing]
chain = ["acme/m1"]

[[providers]]
name = "acme"
base_url = "http://127.0.0.1:9/v1"
keys = ["env:ACME_KEY"]

[[providers.models]]
id = "m1"
tier = "large"
context = 4096
"""
ENV = {"ACME_KEY": "sk-acme-secret"}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _config_file(tmp_path: Path) -> str:
    path = tmp_path / "meshroute.toml"
    path.write_text(PROVIDERS)
    return str(path)


WAL_MODES: dict[Path, int] = {}  # the -wal file's mode while the gateway had it open


def _open(tmp_path: Path, environ: dict[str, str], **cli: str) -> Path:
    """Build a gateway as `meshroute serve --config … --no-mdns` would; the state file's path."""
    settings = load_settings({"config": _config_file(tmp_path), "mdns": False, **cli},
                             {**ENV, **environ})
    gateway = build_gateway(GatewayConfig.build(settings, {**ENV, **environ}))
    assert gateway.store is not None
    path = Path(gateway.store.path)
    wal = path.with_name(path.name + "-wal")
    if wal.exists():
        WAL_MODES[path] = mode(wal)
    gateway.store.close()
    return path


@pytest.fixture(autouse=True)
def _umask() -> object:
    """A permissive umask, so that the modes below are the gateway's doing."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_the_default_is_in_xdg_state_home(tmp_path: Path) -> None:
    state_home = tmp_path / "xdg" / "state"  # neither exists yet
    path = _open(tmp_path, {"XDG_STATE_HOME": str(state_home), "HOME": str(tmp_path / "no")})
    assert path == state_home / "meshroute" / "state.db"
    assert mode(path) == 0o600
    for directory in (state_home / "meshroute", state_home, tmp_path / "xdg"):
        assert mode(directory) == 0o700, directory
    assert WAL_MODES[path] == 0o600  # SQLite's own files follow the database's
    assert not (tmp_path / "no").exists()


@pytest.mark.parametrize("xdg", [None, "", "relative/state"])  # the spec ignores a relative one
def test_without_xdg_state_home_it_is_under_home(tmp_path: Path, xdg: str | None) -> None:
    home = tmp_path / "home"
    home.mkdir(mode=0o755)
    environ = {"HOME": str(home)} | ({} if xdg is None else {"XDG_STATE_HOME": xdg})
    path = _open(tmp_path, environ)
    assert path == home / ".local" / "state" / "meshroute" / "state.db"
    assert mode(path) == 0o600
    for directory in (home / ".local", home / ".local" / "state", path.parent):
        assert mode(directory) == 0o700, directory
    assert mode(home) == 0o755  # what existed is left as it was


def test_state_file_overrides_and_a_new_one_is_private(tmp_path: Path) -> None:
    named = tmp_path / "mine.db"
    assert _open(tmp_path, {"XDG_STATE_HOME": str(tmp_path / "x")},
                 state_file=str(named)) == named
    assert mode(named) == 0o600
    assert not (tmp_path / "x").exists()


def test_an_existing_state_file_keeps_its_mode(tmp_path: Path) -> None:
    named = tmp_path / "shared.db"
    named.touch(mode=0o640)
    os.chmod(named, 0o640)
    _open(tmp_path, {}, state_file=str(named))
    assert mode(named) == 0o640


def test_without_provider_tables_there_is_still_no_default_state_file(tmp_path: Path) -> None:
    assert load_settings({}, {"XDG_STATE_HOME": str(tmp_path)}).state_file is None


@pytest.mark.skipif(sys.platform != "linux", reason="modes as Linux gives them")
def test_serve_creates_the_default_state_file_private(tmp_path: Path) -> None:
    state_home = tmp_path / "state-home"
    env = {**ENV, "XDG_STATE_HOME": str(state_home)}
    with serve_process(["--config", _config_file(tmp_path)], tmp_path / "log", env=env):
        path = state_home / "meshroute" / "state.db"
        assert path.exists() and mode(path) == 0o600
        assert mode(path.parent) == 0o700
    assert f"state in {path} (" in (tmp_path / "log").read_text()


def test_workers_share_the_default_state_file(tmp_path: Path) -> None:
    """The parent creates it (0600) before the workers start; each opens the same file."""
    state_home = tmp_path / "state-home"
    env = {**ENV, "XDG_STATE_HOME": str(state_home)}
    with serve_process(["--config", _config_file(tmp_path), "--workers", "2"],
                       tmp_path / "log", env=env) as (_, proc):
        path = state_home / "meshroute" / "state.db"
        assert path.exists() and mode(path) == 0o600
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    log = (tmp_path / "log").read_text()
    assert "Traceback" not in log
    origins = sqlite3.connect(path).execute("SELECT value FROM meta WHERE name = 'tracker_id'")
    assert origins.fetchone()[0].endswith(("-w0", "-w1"))  # a worker saved it at shutdown
