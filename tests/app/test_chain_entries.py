"""A chain entry names a provider model, a profile, or a mesh model declared with a
`[mesh.NAME]` table; anything else (`chain = [..., "typo-model"]`) is a one-line start-up
error naming it and saying how to declare a mesh model, exit 2 (issue 33)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from meshroute_middleware.app.config import ChainEntryError, check_chains
from meshroute_middleware.core.providers.config import parse_providers_config

CONFIG = """
[routing]
chain = ["fastco/big-model", "qwen", "coding"{typo}]

[profiles.coding]
chain = ["qwen"{other}]

[[providers]]
name = "fastco"
base_url = "http://127.0.0.1:9/v1"
keys = ["env:FAST_A"]

[[providers.models]]
id = "big-model"
tier = "large"

[mesh.qwen]
"""
ERROR = ("[routing] chain names 'typo-model', which is no provider model, no profile and no "
         "declared mesh model; declare a mesh model with an (even empty) [mesh.typo-model] "
         "table, or fix the name")


def _config(typo: str = "", other: str = "") -> str:
    return CONFIG.format(typo=typo, other=other)


def test_provider_models_profiles_and_declared_mesh_models_pass() -> None:
    check_chains(parse_providers_config(tomllib.loads(_config())))
    check_chains(None)


@pytest.mark.parametrize(("typo", "other", "message"), [
    (', "typo-model"', ', "other-typo"', ERROR),
    ("", ', "other-typo"', "[profiles.coding] chain names 'other-typo'"),
])
def test_an_undeclared_entry_is_refused_by_name(typo: str, other: str, message: str) -> None:
    cfg = parse_providers_config(tomllib.loads(_config(typo, other)))
    with pytest.raises(ChainEntryError) as caught:
        check_chains(cfg)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_refuses_it_in_one_line_with_exit_2(tmp_path: Path, workers: int) -> None:
    config = tmp_path / "meshroute.toml"
    config.write_text(_config(', "typo-model"'))
    done = subprocess.run(
        [sys.executable, "-m", "meshroute_middleware.app.cli", "serve", "--port", "0",
         "--no-mdns", "--config", str(config), "--state-file", str(tmp_path / "state.db"),
         "--workers", str(workers)],
        capture_output=True, text=True, timeout=120,
        env={"FAST_A": "sk-fast-AAAA-secret", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"meshroute serve: {ERROR}", done.stderr
