"""Who sees spend (issue 32, row 7): `/metrics` carries each client's series only for a
loopback peer or the admin token's bearer; from any other address it carries their sums
without the `client` label. The LAN peer is a scope's client address (192.0.2.7, TEST-NET-1:
no packet goes anywhere)."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from meshroute_middleware.core.clients import parse_clients

from .fake_provider import FakeProvider, Reply
from .gateway import HI, gateway, providers_doc

pytestmark = pytest.mark.anyio
KEYS = {"alice": "mr-alice-0123456789abcdef", "bob": "mr-bob-0123456789abcdef"}
CLIENTS = parse_clients([{"name": name, "key": "sha256:" + hashlib.sha256(k.encode()).hexdigest()}
                         for name, k in KEYS.items()])
ADMIN = "admin-token-0123456789"
LAN_PEER = ("192.0.2.7", 51000)
ROUTE = 'route="fastco/big-model"'


async def scrape(app: object, peer: tuple[str, int], token: str | None = None) -> str:
    transport = httpx.ASGITransport(app=app, client=peer)  # type: ignore[arg-type]
    headers = {} if token is None else {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:9") as c:
        resp = await c.get("/metrics", headers=headers)
    assert resp.status_code == 200
    return resp.text


async def test_metrics_show_clients_to_loopback_and_the_admin_only(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.default = Reply.ok(tokens=8, prompt_tokens=5)
    with gateway(providers_doc(fast, slow), clients=CLIENTS, admin_token=ADMIN) as gw:
        for name in ("alice", "bob", "bob"):
            resp = httpx.post(f"{gw.url}/v1/chat/completions", timeout=30,
                              headers={"authorization": f"Bearer {KEYS[name]}"},
                              json={"model": "fastco/big-model", "messages": HI})
            assert resp.status_code == 200, resp.text
        app = gw.gateway.app
        lan = await scrape(app, LAN_PEER)
        lan_wrong = await scrape(app, LAN_PEER, "not-the-admin-token")
        lan_admin = await scrape(app, LAN_PEER, ADMIN)
        loopback = await scrape(app, ("127.0.0.1", 51000))
    for text in (lan, lan_wrong):
        assert "client=" not in text
        assert "alice" not in text and "bob" not in text
        assert f'meshroute_client_requests_total{{{ROUTE},status="200"}} 3.0' in text
        assert f'meshroute_client_tokens_total{{kind="completion",{ROUTE}}} 24.0' in text
        assert "meshroute_client_cost_usd_total 0.0" in text
    for text in (lan_admin, loopback):
        assert (f'meshroute_client_requests_total{{client="alice",{ROUTE},status="200"}} 1.0'
                in text)
        assert (f'meshroute_client_requests_total{{client="bob",{ROUTE},status="200"}} 2.0'
                in text)
        assert 'meshroute_client_cost_usd_total{client="bob"} 0.0' in text
