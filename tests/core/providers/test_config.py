"""The provider tables of the config file: parsed, frozen, and refused with the key named."""

from __future__ import annotations

import copy
import dataclasses
import tomllib
from pathlib import Path
from typing import Any

import pytest

from meshroute_middleware.core.providers.config import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_TOTAL_BUDGET_S,
    Limits,
    ProviderConfigError,
    parse_providers_config,
)

EXAMPLE = Path(__file__).parents[3] / "examples" / "providers" / "meshroute.toml"


def minimal() -> dict[str, Any]:
    return {
        "routing": {"chain": ["fastco/big-model", "qwen"]},
        "providers": [{"name": "fastco", "base_url": "http://127.0.0.1:9101/v1",
                       "keys": ["env:FASTCO_KEY_A", "file:/run/keys/b"],
                       "models": [{"id": "big-model", "tier": "large"}]}],
    }


def test_the_example_config_parses_whole() -> None:
    cfg = parse_providers_config(tomllib.loads(EXAMPLE.read_text()))
    assert cfg.routing.strategy == "balanced"
    assert cfg.routing.chain == ("fastco/big-model", "slowco/small-model", "qwen")
    assert cfg.routing.profile == "coding"
    coding = cfg.profile("coding")
    assert coding is not None and coding.chain == ("slowco/small-model", "fastco/big-model")
    fastco = cfg.provider("fastco")
    assert fastco is not None
    assert fastco.base_url == "http://127.0.0.1:9101/v1"
    assert fastco.keys == ("env:FASTCO_KEY_A", "env:FASTCO_KEY_B")
    assert fastco.limits == Limits(rpm=60, rpd=1000, tpm=100000, tpd=1000000)
    big = fastco.model("big-model")
    assert big is not None
    assert (big.tier, big.context, big.price_in, big.price_out, big.monthly_tokens) == (
        "large", 32768, 0.5, 1.5, 5000000)
    assert cfg.split_route("slowco/small-model") is not None
    assert cfg.mesh_tier("qwen") == "medium"


def test_the_example_holds_the_issue_snippet_verbatim() -> None:
    text = EXAMPLE.read_text()
    for line in ['chain = ["fastco/big-model", "slowco/small-model", "qwen"]   # global fallback '
                 'chain ("auto")',
                 'keys = ["env:FASTCO_KEY_A", "env:FASTCO_KEY_B"]   # "env:NAME" or "file:PATH";'
                 ' never a literal',
                 'monthly_tokens = 5000000      # free-tier budget behind the headroom factor, '
                 'optional']:
        assert line in text


def test_defaults_of_a_minimal_config() -> None:
    cfg = parse_providers_config(minimal())
    assert cfg.routing.strategy == "balanced"
    assert cfg.routing.profile is None
    assert cfg.routing.wait_for_key_s == 0.0
    assert cfg.routing.max_attempts == DEFAULT_MAX_ATTEMPTS
    assert cfg.routing.total_budget_s == DEFAULT_TOTAL_BUDGET_S
    model = cfg.providers[0].models[0]
    assert (model.context, model.price_in, model.price_out, model.monthly_tokens,
            model.max_output) == (None, 0.0, 0.0, None, None)
    assert cfg.providers[0].limits == Limits()
    assert cfg.mesh_tier("anything") == "medium"


def test_no_provider_tables_at_all_is_an_empty_config() -> None:
    cfg = parse_providers_config({"port": 8080, "router": {"policy": "thompson"}})
    assert cfg.providers == () and cfg.routing.chain == ()


def test_the_config_is_frozen() -> None:
    cfg = parse_providers_config(minimal())
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.routing.strategy = "fastest"  # type: ignore[misc]


def test_a_provider_name_wins_over_a_mesh_model_with_a_slash() -> None:
    doc = minimal()
    doc["routing"]["chain"] = ["fastco/big-model", "meta-llama/Llama-3-8B"]
    cfg = parse_providers_config(doc)
    assert cfg.split_route("fastco/big-model") is not None
    assert cfg.split_route("meta-llama/Llama-3-8B") is None  # no such provider: a mesh model
    assert not cfg.names_provider("meta-llama/Llama-3-8B")


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    node: Any = doc
    parts = path.split(".")
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node.setdefault(part, {})
    if value is _DEL:
        del node[parts[-1]]
    else:
        node[parts[-1]] = value


_DEL = object()

BAD = [
    ("routing.strategy", "quickest", "[routing]: strategy must be one of"),
    ("routing.chain", "fastco/big-model", "[routing]: chain must be a list"),
    ("routing.chain", ["qwen", "qwen"], "[routing]: chain lists an entry twice"),
    ("routing.chain", ["fastco/nope"], "names provider 'fastco', which has no such model"),
    ("routing.profile", "coding", "[routing] profile 'coding': no [profiles.coding]"),
    ("routing.wait_for_key_s", -1, "[routing]: wait_for_key_s must be >= 0"),
    ("routing.max_attempts", 0, "[routing]: max_attempts must be >= 1"),
    ("routing.max_attempts", 2.5, "[routing]: max_attempts must be an integer"),
    ("routing.total_budget_s", "10", "[routing]: total_budget_s must be a number"),
    ("routing.retries", 3, "[routing]: unknown key(s) retries"),
    ("profiles.Coding", {"chain": []}, "a profile name must match [a-z0-9-]+"),
    ("profiles.cheap", {"chain": []}, "[profiles.cheap]: 'auto:cheap' already means"),
    ("profiles.coding", {"chain": [], "weights": 1}, "[profiles.coding]: unknown key(s)"),
    ("profiles.coding", {"chain": ["fastco/x"]}, "[profiles.coding] chain: 'fastco/x'"),
    ("providers.0.name", "Fast_Co", "[[providers]] #1: name must be a string matching"),
    ("providers.0.base_url", "ftp://x", "[[providers]] 'fastco': base_url must be"),
    ("providers.0.keys", [], "[[providers]] 'fastco': keys must be a non-empty list"),
    ("providers.0.keys", ["env:A", "env:A"], "a key reference is listed twice"),
    ("providers.0.keys", ["env:1BAD"], "keys[0] must be 'env:NAME' or 'file:PATH'"),
    ("providers.0.keys", ["file:"], "keys[0] must be 'env:NAME' or 'file:PATH'"),
    ("providers.0.rpm", 0, "[[providers]] 'fastco': rpm must be >= 1"),
    ("providers.0.tpd", True, "[[providers]] 'fastco': tpd must be an integer"),
    ("providers.0.region", "eu", "[[providers]] 'fastco': unknown key(s) region"),
    ("providers.0.models", [], "needs at least one [[providers.models]]"),
    ("providers.0.models", [{"id": "a", "tier": "large"}, {"id": "a", "tier": "small"}],
     "a model id is listed twice"),
    ("providers.0.models.0.tier", "huge", "model 'big-model': tier must be one of"),
    ("providers.0.models.0.tier", _DEL, "model 'big-model': tier is required"),
    ("providers.0.models.0.id", "", "models[0]: id must be a non-empty string"),
    ("providers.0.models.0.price_in", -0.1, "price_in must be >= 0"),
    ("providers.0.models.0.context", 0, "context must be >= 1"),
    ("providers.0.models.0.monthly_tokens", 1e9, "monthly_tokens must be an integer"),
    ("providers.0.models.0.max_output", 0, "max_output must be >= 1"),
    ("providers.0.models.0.max_output", "4k", "max_output must be an integer"),
    ("providers.0.models.0.free", True, "unknown key(s) free"),
    ("mesh.qwen", {"tier": "giant"}, "[mesh.qwen]: tier must be one of"),
    ("mesh.qwen", {"tier": "small", "ctx": 4}, "[mesh.qwen]: unknown key(s) ctx"),
    ("mesh", "qwen", "[mesh] must be a table"),
    ("providers", {"name": "x"}, "providers must be an array of tables"),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD,
                         ids=[f"{p}={v!r}" if v is not _DEL else f"{p} deleted" for p, v, _ in BAD])
def test_refusals_name_the_table_and_key(path: str, value: Any, message: str) -> None:
    doc = copy.deepcopy(minimal())
    _set(doc, path, value)
    with pytest.raises(ProviderConfigError) as info:
        parse_providers_config(doc)
    assert message in str(info.value)


def test_a_literal_key_is_refused_without_being_echoed() -> None:
    doc = minimal()
    doc["providers"][0]["keys"] = ["sk-live-abcdef0123456789"]
    with pytest.raises(ProviderConfigError) as info:
        parse_providers_config(doc)
    assert "sk-live" not in str(info.value)
    assert "keys[0]" in str(info.value)


def test_a_provider_named_twice_is_refused() -> None:
    doc = minimal()
    doc["providers"].append(copy.deepcopy(doc["providers"][0]))
    with pytest.raises(ProviderConfigError, match="'fastco' is configured twice"):
        parse_providers_config(doc)


def test_a_profile_may_carry_its_own_strategy() -> None:
    doc = minimal()
    doc["profiles"] = {"quick": {"chain": ["qwen"], "strategy": "fastest"}}
    profile = parse_providers_config(doc).profile("quick")
    assert profile is not None and profile.strategy == "fastest"


@pytest.mark.parametrize(("api", "parsed"), [(None, "openai"), ("openai", "openai"),
                                             ("anthropic", "anthropic")])
def test_a_model_names_the_api_it_speaks(api: str | None, parsed: str) -> None:
    doc = copy.deepcopy(minimal())
    if api is not None:  # unset: chat completions, as before
        _set(doc, "providers.0.models.0.api", api)
    assert parse_providers_config(doc).providers[0].models[0].api == parsed


@pytest.mark.parametrize("api", ["gemini", 1, ""])
def test_an_unknown_api_is_refused(api: Any) -> None:
    doc = copy.deepcopy(minimal())
    _set(doc, "providers.0.models.0.api", api)
    with pytest.raises(ProviderConfigError) as info:
        parse_providers_config(doc)
    assert "model 'big-model': api must be one of openai | anthropic" in str(info.value)


def test_a_models_max_output_is_read() -> None:
    doc = copy.deepcopy(minimal())
    _set(doc, "providers.0.models.0.max_output", 4096)
    assert parse_providers_config(doc).providers[0].models[0].max_output == 4096
