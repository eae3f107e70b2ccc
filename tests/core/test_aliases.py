"""`[aliases]`: glob patterns in file order, first match wins, validated at load."""

from __future__ import annotations

from typing import Any

import pytest

from meshroute_middleware.core.aliases import parse_aliases
from meshroute_middleware.core.providers.config import (
    ProviderConfigError,
    parse_providers_config,
)

from .providers.conftest import doc


def test_first_match_wins_in_file_order() -> None:
    aliases = parse_aliases({"claude-haiku-*": "auto:fast", "claude-*": "auto:smart",
                             "gpt-5-codex": "auto", "gpt-?": "qwen"})
    assert aliases.resolve("claude-haiku-4-5") == "auto:fast"
    assert aliases.resolve("claude-sonnet-4-5-20250929") == "auto:smart"
    assert aliases.resolve("gpt-5-codex") == "auto"
    assert aliases.resolve("gpt-5") == "qwen"
    assert aliases.resolve("gpt-5-mini") is None
    assert aliases.resolve("Claude-x") is None  # case-sensitive
    assert aliases.resolve("auto") is None
    assert [a.is_glob for a in aliases.entries] == [True, True, False, True]


def test_a_target_is_not_looked_up_again() -> None:
    aliases = parse_aliases({"a": "b", "b": "c"})
    assert aliases.resolve("a") == "b"


@pytest.mark.parametrize("table", [{"x": ""}, {"x": 3}, {"": "auto"}, {"x\n": "auto"},
                                   {"x" * 300: "auto"}, {"x": " auto"}])
def test_malformed_aliases_are_refused(table: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        parse_aliases(table)


def test_aliases_load_with_the_provider_tables() -> None:
    cfg = parse_providers_config({**doc(), "aliases": {"claude-*": "auto:smart",
                                                       "coder": "auto:coding",
                                                       "big": "fastco/big-model"}})
    assert cfg.aliases.resolve("claude-opus-4-1") == "auto:smart"
    assert cfg.aliases.resolve("coder") == "auto:coding"


@pytest.mark.parametrize(("target", "why"), [
    ("auto:nonsense", "no strategy and no profile"),
    ("fastco/no-such", "no such model"),
])
def test_an_alias_to_nothing_is_refused_at_load(target: str, why: str) -> None:
    with pytest.raises(ProviderConfigError, match=why):
        parse_providers_config({**doc(), "aliases": {"x": target}})
    with pytest.raises(ProviderConfigError, match="aliases"):
        parse_providers_config({**doc(), "aliases": ["x"]})
