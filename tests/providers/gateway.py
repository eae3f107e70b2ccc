"""A gateway with provider routes, in process on a loopback port (test helper)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import httpx

from meshroute_middleware.app.config import GatewayConfig
from meshroute_middleware.app.gateway import Gateway, build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig
from meshroute_middleware.core.providers.config import parse_providers_config

from ..upstream import ServerThread
from .fake_provider import FakeProvider

ENV = {"FAST_A": "sk-fast-AAAA-secret", "FAST_B": "sk-fast-BBBB-secret",
       "SLOW_A": "sk-slow-CCCC-secret"}
HI = [{"role": "user", "content": "hi"}]


def providers_doc(fast: FakeProvider, slow: FakeProvider, *,
                  chain: tuple[str, ...] = ("fastco/big-model", "slowco/small-model"),
                  fast_limits: dict[str, int] | None = None,
                  routing: dict[str, Any] | None = None,
                  mesh: dict[str, Any] | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "routing": {"chain": list(chain), **(routing or {})},
        "providers": [
            # round-robin keys: these tests send one prompt again and again, which provider-key
            # affinity would keep on one key (tests/providers/test_affinity.py: it on)
            {"name": "fastco", "base_url": fast.base_url, "keys": ["env:FAST_A", "env:FAST_B"],
             "cache_ttl": 0, **(fast_limits or {}),
             "models": [{"id": "big-model", "tier": "large", "context": 4096}]},
            {"name": "slowco", "base_url": slow.base_url, "keys": ["env:SLOW_A"],
             "models": [{"id": "small-model", "tier": "small", "context": 2048}]}]}
    if mesh:
        doc["mesh"] = mesh
    return doc


@dataclass
class Running:
    url: str
    gateway: Gateway

    def chat(self, model: str = "auto", headers: dict[str, str] | None = None,
             **body: Any) -> httpx.Response:
        return httpx.post(f"{self.url}/v1/chat/completions", headers=headers, timeout=30,
                          json={"model": model, "messages": HI, **body})


@contextmanager
def gateway(doc: dict[str, Any], clock: Callable[[], float] | None = None,
            **settings: Any) -> Iterator[Running]:
    base = ServeSettings(mdns=False, seed=3, router=RouterConfig(explore_share=0.0),
                         first_byte_timeout_s=2.0, connect_timeout_s=1.0,
                         state_file=":memory:", providers=parse_providers_config(doc))
    config = GatewayConfig.build(replace(base, **settings), ENV)
    kwargs: dict[str, Any] = {} if clock is None else {"clock": clock}
    gw = build_gateway(config, **kwargs)
    with ServerThread(gw.app) as server:
        yield Running(server.url, gw)


def assert_no_key_in(*texts: str) -> None:
    for text in texts:
        for secret in ENV.values():
            assert secret not in text
