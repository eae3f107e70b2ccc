"""A provider config shared by the chain, router and exhaustion tests."""

from __future__ import annotations

from typing import Any

import pytest

from meshroute_middleware.core.providers.config import ProvidersConfig, parse_providers_config

T0 = 1_796_040_000.0  # 2026-11-30 12:00 UTC
MESH = frozenset({"qwen", "llama"})


def doc() -> dict[str, Any]:
    return {
        "routing": {"strategy": "balanced", "chain": ["fastco/big-model", "slowco/small-model",
                                                      "qwen"], "profile": "coding"},
        "profiles": {"coding": {"chain": ["slowco/small-model", "fastco/big-model"]},
                     "mesh-first": {"chain": ["qwen", "fastco/big-model"],
                                       "strategy": "fastest"}},
        "providers": [
            {"name": "fastco", "base_url": "http://127.0.0.1:9101/v1",
             "keys": ["env:FASTCO_KEY_A", "env:FASTCO_KEY_B"], "rpm": 60,
             "models": [{"id": "big-model", "tier": "large", "context": 32768,
                         "price_in": 0.5, "price_out": 1.5, "monthly_tokens": 5_000_000},
                        {"id": "huge-model", "tier": "frontier", "context": 128000,
                         "price_in": 3.0, "price_out": 15.0}]},
            {"name": "slowco", "base_url": "http://127.0.0.1:9102/v1",
             "keys": ["env:SLOWCO_KEY"], "models": [{"id": "small-model", "tier": "small",
                                                     "context": 8192}]},
        ],
        "mesh": {"qwen": {"tier": "medium"}, "llama": {"tier": "small"}},
    }


@pytest.fixture
def cfg() -> ProvidersConfig:
    return parse_providers_config(doc())
