"""Resolving a request's model to a strategy and candidate routes; sessions."""

from __future__ import annotations

import pytest

from meshroute_middleware.core.errors import UnknownModelError
from meshroute_middleware.core.providers.chain import InvalidModelError, Sessions, resolve
from meshroute_middleware.core.providers.config import ProvidersConfig, parse_providers_config

from .conftest import MESH, doc

EVERYTHING = ("fastco/big-model", "fastco/huge-model", "slowco/small-model", "llama", "qwen")


@pytest.mark.parametrize(("model", "strategy", "routes"), [
    ("auto", "balanced", ("slowco/small-model", "fastco/big-model")),  # the active profile
    ("auto:coding", "balanced", ("slowco/small-model", "fastco/big-model")),
    ("auto:mesh-first", "fastest", ("qwen", "fastco/big-model")),
    ("auto:fast", "fastest", EVERYTHING),
    ("auto:fastest", "fastest", EVERYTHING),
    ("auto:speed", "fastest", EVERYTHING),
    ("auto:smart", "smartest", EVERYTHING),
    ("auto:reliable", "reliable", EVERYTHING),
    ("auto:balanced", "balanced", EVERYTHING),
    ("auto:cheap", "cheapest", EVERYTHING),
    ("fastco/huge-model", "balanced", ("fastco/huge-model",)),
    ("qwen", "balanced", ("qwen",)),
])
def test_resolve(cfg: ProvidersConfig, model: str, strategy: str,
                 routes: tuple[str, ...]) -> None:
    res = resolve(cfg, model, MESH)
    assert res.model == model
    assert res.strategy == strategy
    assert tuple(c.route for c in res.candidates) == routes


def test_auto_without_a_profile_is_the_global_chain() -> None:
    d = doc()
    del d["routing"]["profile"]
    res = resolve(parse_providers_config(d), "auto", MESH)
    assert [c.route for c in res.candidates] == ["fastco/big-model", "slowco/small-model",
                                                 "qwen"]


def test_a_profile_with_its_own_strategy(cfg: ProvidersConfig) -> None:
    d = doc()
    d["profiles"]["quick"] = {"chain": ["qwen"], "strategy": "fastest"}
    assert resolve(parse_providers_config(d), "auto:quick", MESH).strategy == "fastest"


def test_a_mesh_entry_no_node_serves_is_listed_as_missing(cfg: ProvidersConfig) -> None:
    d = doc()
    del d["routing"]["profile"]
    res = resolve(parse_providers_config(d), "auto", {"llama"})
    assert [c.route for c in res.candidates] == ["fastco/big-model", "slowco/small-model"]
    assert res.missing == ("qwen",)


def test_candidates_carry_what_the_forwarder_needs(cfg: ProvidersConfig) -> None:
    big, = resolve(cfg, "fastco/big-model", MESH).candidates
    assert big.is_provider and big.upstream_model == "big-model" and big.context == 32768
    assert big.provider is not None and big.provider.base_url == "http://127.0.0.1:9101/v1"
    qwen, = resolve(cfg, "qwen", MESH).candidates
    assert not qwen.is_provider and qwen.upstream_model == "qwen" and qwen.context is None
    assert (qwen.tier, resolve(cfg, "llama", MESH).candidates[0].tier) == ("medium", "small")


@pytest.mark.parametrize("model", ["auto:", "auto:quickest", "auto:FAST", "auto:coding2"])
def test_an_unknown_auto_alias_is_invalid(cfg: ProvidersConfig, model: str) -> None:
    with pytest.raises(InvalidModelError, match="unknown model alias"):
        resolve(cfg, model, MESH)


@pytest.mark.parametrize(("model", "message"), [
    ("fastco/tiny", "provider 'fastco' has no model 'tiny'"),
    ("mistral", "no provider or mesh node serves model 'mistral'"),
    ("nobody/big-model", "no provider or mesh node serves"),
])
def test_an_unknown_model(cfg: ProvidersConfig, model: str, message: str) -> None:
    with pytest.raises(UnknownModelError, match=message):
        resolve(cfg, model, MESH)


def test_a_mesh_model_with_a_slash_resolves_when_no_provider_has_that_name(
        cfg: ProvidersConfig) -> None:
    res = resolve(cfg, "meta/llama-3", {"meta/llama-3"})
    assert [c.is_provider for c in res.candidates] == [False]


def test_nothing_configured_resolves_to_no_candidates() -> None:
    res = resolve(parse_providers_config({}), "auto", set())
    assert res.candidates == ()


def test_sessions_remember_expire_and_stay_bounded() -> None:
    sessions = Sessions(ttl_s=60.0, max_entries=2)
    sessions.served("a", "fastco/big-model", 0.0)
    assert sessions.get("a", 59.0) == "fastco/big-model"
    assert sessions.get("a", 61.0) is None
    for name in ("x", "y", "z"):
        sessions.served(name, "qwen", 100.0)
    assert len(sessions) == 2 and sessions.get("x", 100.0) is None
    sessions.forget("z")
    assert sessions.get("z", 100.0) is None
    assert sessions.get(None, 100.0) is None
