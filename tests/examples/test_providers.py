"""examples/providers: the provider config parses with its fallback chains, and the README's
one-command try (try.py) really works on loopback."""

from __future__ import annotations

import re
import tomllib

from meshroute_middleware.core.providers.config import parse_providers_config

from .run import EXAMPLES, run_example_output


def test_the_example_config_parses_with_its_fallback_chains() -> None:
    with open(EXAMPLES / "providers" / "meshroute.toml", "rb") as f:
        config = parse_providers_config(tomllib.load(f))
    assert [p.name for p in config.providers] == ["fastco", "slowco"]
    assert config.routing.chain == ("fastco/big-model", "slowco/small-model", "qwen")
    assert [p.name for p in config.profiles] == ["coding"]


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
