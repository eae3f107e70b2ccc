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
from meshroute_middleware.core.providers.chain import resolve
from meshroute_middleware.core.providers.config import parse_providers_config

from ..providers.fake_provider import FakeProvider
from ..providers.gateway import gateway, providers_doc

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


NESTED = """
[routing]
chain = ["coding", "fastco/big-model"]

[profiles.coding]
chain = ["qwen", "review", "fastco/big-model"]

[profiles.review]
chain = ["slowco/small-model", "coding", "qwen"]

[[providers]]
name = "fastco"
base_url = "http://127.0.0.1:9/v1"
keys = ["env:FAST_A"]

[[providers.models]]
id = "big-model"
tier = "large"

[[providers]]
name = "slowco"
base_url = "http://127.0.0.1:9/v1"
keys = ["env:SLOW_A"]

[[providers.models]]
id = "small-model"
tier = "small"

[mesh.qwen]
"""


@pytest.mark.parametrize(("model", "routes"), [
    # the profile's routes in its place, each route once, a cycle (review -> coding) cut
    ("auto", ["qwen", "slowco/small-model", "fastco/big-model"]),
    ("auto:coding", ["qwen", "slowco/small-model", "fastco/big-model"]),
    ("auto:review", ["slowco/small-model", "qwen", "fastco/big-model"]),
])
def test_a_profile_named_in_a_chain_routes_as_its_own_chain(model: str,
                                                            routes: list[str]) -> None:
    cfg = parse_providers_config(tomllib.loads(NESTED))
    check_chains(cfg)  # passes the start-up check, as it did: and now routes too
    resolved = resolve(cfg, model, mesh_models={"qwen"})
    assert [c.route for c in resolved.candidates] == routes
    assert resolved.missing == ()


def test_a_mesh_model_of_a_profiles_name_is_the_mesh_model() -> None:
    cfg = parse_providers_config(tomllib.loads(NESTED.replace("[mesh.qwen]", "[mesh.review]")))
    resolved = resolve(cfg, "auto", mesh_models={"review"})
    assert [c.route for c in resolved.candidates] == ["review", "fastco/big-model"]
    assert resolved.missing == ("qwen",)  # declared nowhere now; nothing serves it


def test_a_request_through_a_chain_of_one_profile_is_answered() -> None:
    fast, slow = FakeProvider("fast"), FakeProvider("slow", models=("small-model",))
    with fast.serve(), slow.serve():
        doc = providers_doc(fast, slow, chain=("thrifty",))
        doc["profiles"] = {"thrifty": {"chain": ["slowco/small-model", "fastco/big-model"]}}
        with gateway(doc) as gw:
            answer = gw.chat("auto")
    assert answer.status_code == 200, answer.text
    assert answer.headers["x-meshroute-route"] == "slowco/small-model#1"
    assert len(slow.seen) == 1 and fast.seen == []
