"""`[[node_keys]]`: a node's own key goes to that node, at the URL it is bound to, in place of
any authorization the client's allowed headers carry; to no other node, and never printed."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from meshroute_middleware.app.config import GatewayConfig
from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.chat.keyring import KeyRefError
from meshroute_middleware.core import RouterConfig
from meshroute_middleware.core.providers.config import (
    ProviderConfigError,
    parse_providers_config,
)
from meshroute_middleware.forwarding.client import ForwardTimeouts
from meshroute_middleware.forwarding.memory import ASGIForwarder

from ..conftest import FakeClock
from ..upstream import FakeChat

pytestmark = pytest.mark.anyio
KEY = "sk-node-secret-9a8b"
A, B = "http://127.0.0.1:1", "http://127.0.0.1:2"


def table(**entry: Any) -> dict[str, Any]:
    return {"node_keys": [{"node": "a", "url": A, "key": "env:NODE_KEY", **entry}]}


def gateway(heads: dict[str, FakeChat], doc: dict[str, Any],
            **settings: Any) -> tuple[Any, GatewayConfig]:
    base = ServeSettings(mdns=False, seed=7, router=RouterConfig(explore_share=0.0),
                         providers=parse_providers_config(doc), state_file=":memory:",
                         **settings)
    config = GatewayConfig.build(base, {"NODE_KEY": KEY})
    forwarder = ASGIForwarder({u: h.app() for u, h in heads.items()},
                              ForwardTimeouts(first_byte_s=0.5))
    return build_gateway(config, forwarder=forwarder, clock=FakeClock()), config


def join(gw: Any, node_id: str, url: str) -> None:
    gw.mesh.upsert_raw({"node_id": node_id, "model": "m", "start": 0, "end": 0, "layers": 1,
                        "url": url}, "test")


async def ask(gw: Any, pin: str, **headers: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=gw.app),
                                 base_url="http://127.0.0.1") as client:
        return await client.post("/v1/chat/completions", headers=headers, json={
            "model": "m", "messages": [{"role": "user", "content": "hi"}], "route": [pin]})


async def test_the_key_reaches_its_node_only_and_replaces_a_forwarded_one() -> None:
    a, b = FakeChat("a", tokens=2), FakeChat("b", tokens=2)
    gw, config = gateway({A: a, B: b}, table(), forward_headers=("authorization",))
    join(gw, "a", A)
    join(gw, "b", B)
    for _ in range(2):
        assert (await ask(gw, "a", authorization="Bearer client")).status_code == 200
        assert (await ask(gw, "b", authorization="Bearer client")).status_code == 200
    assert [s["headers"]["authorization"] for s in a.seen] == [f"Bearer {KEY}"] * 2
    assert [s["headers"]["authorization"] for s in b.seen] == ["Bearer client"] * 2
    assert KEY not in repr(config) and KEY not in str(config.node_secrets)


async def test_a_node_re_pointed_elsewhere_loses_the_key() -> None:
    a, b = FakeChat("a", tokens=2), FakeChat("b", tokens=2)
    gw, _ = gateway({A: a, B: b}, table())
    join(gw, "a", B)  # node a's record now points at B's URL: the key is not sent there
    assert (await ask(gw, "a")).status_code == 200
    assert "authorization" not in b.seen[0]["headers"]


@pytest.mark.parametrize(("entry", "why"), [
    ({"key": "sk-pasted"}, "env:NAME"), ({"url": "ftp://x"}, "url"),
    ({"node": "a b"}, "node id"), ({"extra": 1}, "unknown key"),
])
def test_node_keys_are_validated(entry: dict[str, Any], why: str) -> None:
    with pytest.raises(ProviderConfigError, match=why) as info:
        parse_providers_config(table(**entry))
    assert "sk-pasted" not in str(info.value)


def test_an_unset_variable_is_named_at_start() -> None:
    base = ServeSettings(mdns=False, providers=parse_providers_config(table()))
    with pytest.raises(KeyRefError, match="NODE_KEY"):
        GatewayConfig.build(base, {})
