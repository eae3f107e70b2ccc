"""The provider config under hostile documents: a ProvidersConfig or ProviderConfigError."""

from __future__ import annotations

import copy
import math
from typing import Any

from hypothesis import given
from hypothesis import strategies as hs

from meshroute_middleware.core.providers.config import (
    ProviderConfigError,
    ProvidersConfig,
    parse_providers_config,
)

from ..core.providers.conftest import doc
from .strategies import FUZZ, JSON

# paths into the valid document where a hostile value is put (or the key removed)
PATHS: list[tuple[Any, ...]] = [
    ("routing",), ("routing", "strategy"), ("routing", "chain"), ("routing", "profile"),
    ("routing", "wait_for_key_s"), ("routing", "max_attempts"), ("routing", "total_budget_s"),
    ("profiles",), ("profiles", "coding"), ("profiles", "coding", "chain"),
    ("providers",), ("providers", 0), ("providers", 0, "name"), ("providers", 0, "base_url"),
    ("providers", 0, "keys"), ("providers", 0, "rpm"), ("providers", 0, "models"),
    ("providers", 0, "models", 0), ("providers", 0, "models", 0, "id"),
    ("providers", 0, "models", 0, "tier"), ("providers", 0, "models", 0, "context"),
    ("providers", 0, "models", 0, "price_in"), ("providers", 1, "name"),
    ("mesh",), ("mesh", "qwen"), ("mesh", "qwen", "tier"),
]


@hs.composite
def documents(draw: hs.DrawFn) -> Any:
    data: Any = doc()
    for path in draw(hs.lists(hs.sampled_from(PATHS), min_size=1, max_size=3)):
        data = copy.deepcopy(data)
        parent: Any = data
        try:
            for step in path[:-1]:
                parent = parent[step]
            if draw(hs.booleans()):
                parent[path[-1]] = draw(JSON)
            elif isinstance(parent, dict):
                parent.pop(path[-1], None)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier change removed the way there
    return data


@FUZZ
@given(documents() | hs.dictionaries(hs.text(max_size=10), JSON, max_size=4))
def test_provider_config_validates_or_refuses(data: Any) -> None:
    try:
        cfg = parse_providers_config(data)
    except ProviderConfigError as exc:
        assert str(exc)
        return
    assert isinstance(cfg, ProvidersConfig)
    for provider in cfg.providers:
        assert isinstance(provider.name, str) and provider.name
        for model in provider.models:
            assert isinstance(model.id, str) and model.id
    assert math.isfinite(cfg.routing.wait_for_key_s) and cfg.routing.wait_for_key_s >= 0
