"""examples/providers: the provider config parses with its fallback chains, and the README's
one-command try (try.py) really works on loopback."""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path

import pytest

from meshroute_middleware.app.settings import load_settings
from meshroute_middleware.core.providers.config import parse_providers_config

from .run import EXAMPLES, run_example_output


def test_the_example_config_parses_with_its_fallback_chains() -> None:
    with open(EXAMPLES / "providers" / "meshroute.toml", "rb") as f:
        config = parse_providers_config(tomllib.load(f))
    assert [p.name for p in config.providers] == ["fastco", "slowco"]
    assert config.routing.chain == ("fastco/big-model", "slowco/small-model", "qwen")
    assert [p.name for p in config.profiles] == ["coding"]


# both examples' fake providers listen on 127.0.0.1:9101 and :9102 (the example config's
# base_url): one xdist worker runs them, one after the other
@pytest.mark.xdist_group("examples-providers-ports")
def test_the_example_try_runs_the_example_config() -> None:
    out, err = run_example_output("providers/try.py")
    assert "-> 200 route=fastco/big-model#1 tried=fastco/big-model#1" in out
    assert "-> 200 route=fastco/big-model#2 tried=fastco/big-model#2" in out
    # a 429, then the other key (which one is next depends on the 'auto' request before it)
    assert re.search(r"429 cools.*-> 200 route=fastco/big-model#(\d) "
                     r"tried=fastco/big-model#(?!\1)\d,fastco/big-model#\1", out)
    assert "fastco/big-model#1: cooldown for" in out
    assert "fastco got model='big-model' with $FASTCO_KEY_A" in out
    assert "demo-fastco-key" not in out + err


def test_the_example_clients_append_to_the_example_config(tmp_path: Path) -> None:
    team = tmp_path / "team.toml"
    team.write_text((EXAMPLES / "providers" / "meshroute.toml").read_text() + "\n"
                    + (EXAMPLES / "providers" / "clients.toml").read_text())
    settings = load_settings({"config": str(team), "state_file": ":memory:"}, {})
    assert [(c.name, c.models) for c in settings.clients] == [
        ("alice-laptop", ("auto", "qwen", "fastco/*")), ("ci", ("auto:*",))]
    assert settings.clients[1].client().key_digest == hashlib.sha256(
        b"mr-demo-ci-key-not-a-real-one-0123").digest()  # the key try_clients.py sends


@pytest.mark.xdist_group("examples-providers-ports")
def test_the_example_try_clients_shows_each_answer() -> None:
    out, err = run_example_output("providers/try_clients.py")
    lines = {" ".join(line.split()[:-1]): line.split()[-1] for line in out.splitlines()
             if "->" in line}
    assert re.search(r"^no key\s+auto\s+-> 401 missing_api_key$", out, re.M)
    assert re.search(r"^a wrong key\s+auto\s+-> 401 invalid_api_key$", out, re.M)
    assert re.search(r"^alice-laptop\s+auto\s+-> 200 route=", out, re.M)
    assert re.search(r"^alice-laptop\s+fastco/big-model\s+-> 200 route=fastco/", out, re.M)
    assert re.search(r"^alice-laptop\s+slowco/small-model\s+-> 403 model_not_allowed$", out,
                     re.M)
    assert re.search(r"^ci \(sha256: form\)\s+auto:coding\s+-> 200 route=", out, re.M)
    assert re.search(r"^ci \(sha256: form\)\s+auto\s+-> 403 model_not_allowed$", out, re.M)
    assert len(lines) == 7
    assert "providers got 3 requests, client keys among their headers: none" in out
    assert "mr-demo-" not in err
