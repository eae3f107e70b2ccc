"""The demo's provider routes: the fake provider refuses past its tight limit like a provider,
and the config it writes parses, with the environment its key reference needs."""

from __future__ import annotations

import contextlib
import tomllib
from pathlib import Path

import httpx
import pytest

from meshroute_middleware.app.demo.providers import (
    CHAIN_MODEL,
    KEY_ENV,
    LIMIT,
    PROVIDER,
    PROVIDER_MODEL,
    provider_routes,
)
from meshroute_middleware.core.providers.config import parse_providers_config

pytestmark = pytest.mark.anyio


async def test_the_fake_provider_rate_limits_and_its_config_chains_it(tmp_path: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        fake = await provider_routes(stack, tmp_path)
        limiter = fake.limiter
        config = parse_providers_config(tomllib.loads(fake.config.read_text()))
        base_url = config.providers[0].base_url
        body = {"model": PROVIDER_MODEL, "max_tokens": 2,
                "messages": [{"role": "user", "content": "hi"}]}
        async with httpx.AsyncClient(timeout=30) as client:
            statuses = [(await client.post(base_url + "/chat/completions", json=body))
                        for _ in range(LIMIT + 2)]
    assert [r.status_code for r in statuses] == [200] * LIMIT + [429, 429]
    refused = statuses[-1]
    assert int(refused.headers["retry-after"]) >= 1
    assert refused.json()["error"]["type"] == "rate_limit_error"
    assert limiter.refused == 2
    assert config.routing.chain == (f"{PROVIDER}/{PROVIDER_MODEL}", "qwen-demo")
    assert CHAIN_MODEL == "auto"
    assert config.providers[0].keys == (f"env:{KEY_ENV}",) and set(fake.environ) == {KEY_ENV}
