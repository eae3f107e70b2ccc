"""A chain naming a model nobody serves (`chain = [..., "typo-model"]`) is said at start, with
the chain and the model named, and in /v1/routing's config warnings (issue 33, item 6)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import httpx
import pytest

from meshroute_middleware.app.config import chain_warnings
from meshroute_middleware.core.providers.config import (
    parse_providers_config,
    unserved_chain_entries,
)

from ..upstream import serve_process
from .gateway import ENV

CONFIG = """
[routing]
chain = ["fastco/big-model", "qwen", "typo-model"]

[profiles.coding]
chain = ["qwen", "other-typo"]

[[providers]]
name = "fastco"
base_url = "http://127.0.0.1:9/v1"
keys = ["env:FAST_A"]

[[providers.models]]
id = "big-model"
tier = "large"

[mesh.qwen]
"""
WARNING = ("[routing] chain names 'typo-model', which is no provider model and has no "
           "[mesh.typo-model] table")


def test_unserved_chain_entries_name_the_chain_and_the_model() -> None:
    cfg = parse_providers_config(tomllib.loads(CONFIG))
    assert unserved_chain_entries(cfg) == [("[routing] chain", "typo-model"),
                                           ("[profiles.coding] chain", "other-typo")]
    assert WARNING in chain_warnings(cfg)[0]
    assert "declare a mesh model with an (even empty) [mesh.typo-model] table" in \
        chain_warnings(cfg)[0]
    assert chain_warnings(None) == []


@pytest.mark.parametrize("workers", [1, 2])
def test_serve_warns_of_a_chain_entry_nobody_serves(tmp_path: Path, workers: int) -> None:
    config, log = tmp_path / "meshroute.toml", tmp_path / "serve.log"
    config.write_text(CONFIG)
    flags = ["--config", str(config), "--state-file", str(tmp_path / "state.db"),
             "--workers", str(workers)]
    with serve_process(flags, log, ENV) as (url, _):
        table = httpx.get(f"{url}/v1/routing", timeout=5).json()
    lines = [line for line in log.read_text().splitlines() if WARNING in line]
    assert len(lines) == 1 and " WARNING " in lines[0], log.read_text()
    assert sum("'other-typo'" in line for line in log.read_text().splitlines()) == 1
    assert "'qwen'" not in log.read_text()  # declared with an empty [mesh.qwen]
    assert any(WARNING in w for w in table["config"]["warnings"])
