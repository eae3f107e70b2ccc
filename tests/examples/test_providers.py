"""examples/providers: the provider config parses with its fallback chains (try.py is run by
tests/providers/test_example_try.py)."""

from __future__ import annotations

import tomllib

from meshroute_middleware.core.providers.config import parse_providers_config

from .run import EXAMPLES


def test_the_example_config_parses_with_its_fallback_chains() -> None:
    with open(EXAMPLES / "providers" / "meshroute.toml", "rb") as f:
        config = parse_providers_config(tomllib.load(f))
    assert [p.name for p in config.providers] == ["fastco", "slowco"]
    assert config.routing.chain == ("fastco/big-model", "slowco/small-model", "qwen")
    assert [p.name for p in config.profiles] == ["coding"]
