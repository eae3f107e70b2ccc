"""Token estimates of a chat request: what to reserve and what must fit in the context."""

from __future__ import annotations

import math
from typing import Any

import pytest

from meshroute_middleware.core.providers.config import parse_providers_config
from meshroute_middleware.core.providers.exhaustion import PassedOver
from meshroute_middleware.core.providers.router import ChainAttempt, ProviderRouter
from meshroute_middleware.core.providers.tokens import (
    DEFAULT_COMPLETION_TOKENS,
    TokenEstimate,
    estimate,
)


@pytest.mark.parametrize(("body", "prompt", "max_completion"), [
    ({"messages": [{"role": "user", "content": "x" * 40}]}, 10 + 4, None),
    ({"messages": [{"role": "user", "content": "abc"}], "max_tokens": 100}, 1 + 4, 100),
    ({"messages": [{"role": "user", "content": "abc"}], "max_tokens": 100,
      "max_completion_tokens": 7}, 5, 7),
    ({"messages": [{"role": "system", "content": "a" * 8},
                   {"role": "user", "content": [{"type": "text", "text": "b" * 8},
                                                {"type": "image_url", "image_url": {}}]}]},
     4 + 8, None),
    ({"messages": "not a list"}, 0, None),
    ({"messages": [None, {"content": None}], "max_tokens": True}, 8, None),
    ({}, 0, None),
    ({"messages": [], "max_tokens": -5}, 0, None),
    # issue 32: tool schemas, tool calls and reasoning are prompt too (every string, keys too)
    ({"messages": [], "tools": [{"type": "function", "function": {"name": "f" * 12}}]},
     math.ceil((4 + 8 + 8 + 4 + 12) / 4), None),
    ({"messages": [], "functions": [{"name": "abcd", "parameters": {"x": 1}}]},
     math.ceil((4 + 4 + 10 + 1) / 4), None),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "a" * 40}}]}]},
     math.ceil((2 + 1 + 4 + 8 + 8 + 4 + 1 + 9 + 40) / 4) + 4, None),
    ({"messages": [{"role": "assistant", "content": "ab", "reasoning_content": "r" * 14}]},
     4 + 4, None),
])
def test_estimate(body: dict[str, Any], prompt: int, max_completion: int | None) -> None:
    assert estimate(body) == TokenEstimate(prompt, max_completion)


def test_reserve_and_context_need() -> None:
    assert TokenEstimate(10, None).reserve == 10 + DEFAULT_COMPLETION_TOKENS
    assert TokenEstimate(10, None).context_need == 10
    assert TokenEstimate(10, 50).reserve == TokenEstimate(10, 50).context_need == 60


def test_acquire_checks_the_context_against_the_need_not_the_reservation() -> None:
    cfg = parse_providers_config({"providers": [
        {"name": "p", "base_url": "http://127.0.0.1:1/v1", "keys": ["env:K"],
         "models": [{"id": "m", "tier": "small", "context": 100}]}]})
    router = ProviderRouter(cfg)
    cand = router.resolve("p/m", ()).candidates[0]
    est = TokenEstimate(90, None)  # fits; the default reservation (346) would not
    assert isinstance(router.acquire(cand, est.reserve, 0.0, context_tokens=est.context_need),
                      ChainAttempt)
    assert router.acquire(cand, est.reserve, 0.0) == [PassedOver("p/m", "context")]
