"""GET /v1/usage: who sees which rows, the shapes, and the 400s (issue 24)."""

from __future__ import annotations

import hashlib
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from meshroute_middleware.api import UsageAPI
from meshroute_middleware.chat.spend import ClientSpend
from meshroute_middleware.core.clients import Client
from meshroute_middleware.core.clients_budget import DAY_S, ClientGates, Spent
from meshroute_middleware.state.limits import MemoryLimits

pytestmark = pytest.mark.anyio
DAY = 20_420
T0 = DAY * DAY_S + 3600
ADMIN = "admin-secret"
CLIENTS = [Client(n, hashlib.sha256(f"key-{n}".encode()).digest()) for n in ("alice", "bob")]


def ledger() -> MemoryLimits:
    """A store holding: alice 2 requests on p/m (day 0) + 1 on mesh-q (day 1); bob 1 on p/m."""
    gates = ClientGates()
    for client, _route, day, spent in [
            ("alice", "p/m", DAY, Spent("p/m", 10, 5, 0.25, False)),
            ("alice", "p/m", DAY, Spent("p/m", 20, 5, 0.5, True)),
            ("alice", "q", DAY + 1, Spent("q", 1, 1, 0.0, False)),
            ("bob", "p/m", DAY + 1, Spent("p/m", 3, 3, 0.1, False))]:
        a = gates.admit(next(c for c in CLIENTS if c.name == client), 1, day * DAY_S)
        assert not isinstance(a, Exception)
        gates.settle(a, spent, day * DAY_S + 60)  # type: ignore[arg-type]
    store = MemoryLimits()
    for section, rows in gates.snapshot(T0).items():
        for row in rows:
            store.rows[(section, str(row["name"]), int(row["key"]))] = row
    return store


def client(admin_token: str | None = ADMIN, store: MemoryLimits | None = None,
           address: str = "127.0.0.1") -> httpx.AsyncClient:
    api = UsageAPI(ClientSpend(store or ledger()), CLIENTS, admin_token=admin_token)
    transport = httpx.ASGITransport(Starlette(routes=api.routes()), client=(address, 1234))
    return httpx.AsyncClient(transport=transport, base_url="http://gw")


async def get(c: httpx.AsyncClient, key: str | None = None, header: str = "authorization",
              **params: str) -> httpx.Response:
    headers = {} if key is None else {
        header: f"Bearer {key}" if header == "authorization" else key}
    return await c.get("/v1/usage", params=params, headers=headers)


def rows(resp: httpx.Response) -> list[dict[str, Any]]:
    assert resp.status_code == 200, resp.text
    data: list[dict[str, Any]] = resp.json()["data"]
    return data


async def test_the_admin_token_sees_every_client() -> None:
    async with client() as c:
        resp = await get(c, ADMIN)
    assert resp.json()["object"] == "list" and resp.json()["group_by"] == "client"
    assert rows(resp) == [
        {"client": "alice", "requests": 3, "prompt_tokens": 31, "completion_tokens": 11,
         "cost_usd": 0.75, "errors": 1, "cached_tokens": 0,
         "cache_write_tokens": 0},
        {"client": "bob", "requests": 1, "prompt_tokens": 3, "completion_tokens": 3,
         "cost_usd": 0.1, "errors": 0, "cached_tokens": 0,
         "cache_write_tokens": 0}]


async def test_a_client_key_sees_its_own_rows_only() -> None:
    async with client() as c:
        own = await get(c, "key-alice", group_by="route")
        by_header = await get(c, "key-bob", header="x-api-key")
        named = await get(c, "key-alice", client="alice", group_by="day")
        other = await get(c, "key-alice", client="bob")
    assert rows(own) == [
        {"route": "p/m", "requests": 2, "prompt_tokens": 30, "completion_tokens": 10,
         "cost_usd": 0.75, "errors": 1, "cached_tokens": 0,
         "cache_write_tokens": 0},
        {"route": "q", "requests": 1, "prompt_tokens": 1, "completion_tokens": 1,
         "cost_usd": 0.0, "errors": 0, "cached_tokens": 0,
         "cache_write_tokens": 0}]
    assert [r["client"] for r in rows(by_header)] == ["bob"]
    assert [(r["day"], r["date"]) for r in rows(named)] == [(DAY, "2025-11-28"),
                                                            (DAY + 1, "2025-11-29")]
    assert other.status_code == 403 and other.json()["error"]["code"] == "forbidden"


async def test_filters_since_client_and_a_comma_list_of_groups() -> None:
    async with client() as c:
        later = await get(c, ADMIN, since=str((DAY + 1) * DAY_S + 5), group_by="client,route")
        alice = await get(c, ADMIN, client="alice", group_by="client")
        nobody = await get(c, ADMIN, client="carol")
    assert [(r["client"], r["route"], r["requests"]) for r in rows(later)] == [
        ("alice", "q", 1), ("bob", "p/m", 1)]
    assert [r["requests"] for r in rows(alice)] == [3]
    assert rows(nobody) == []


@pytest.mark.parametrize(("key", "code"), [(None, "missing_api_key"),
                                           ("wrong", "invalid_api_key")])
async def test_no_key_or_a_wrong_one_is_401(key: str | None, code: str) -> None:
    async with client() as c:
        resp = await get(c, key)
    assert resp.status_code == 401 and resp.json()["error"]["code"] == code


async def test_without_an_admin_token_loopback_is_the_admin_and_others_need_a_key() -> None:
    async with client(admin_token=None) as c:
        assert len(rows(await get(c))) == 2
        assert [r["client"] for r in rows(await get(c, "key-bob"))] == ["bob"]
    async with client(admin_token=None, address="10.1.2.3") as c:
        assert (await get(c)).status_code == 401
        assert [r["client"] for r in rows(await get(c, "key-alice"))] == ["alice"]


@pytest.mark.parametrize(("params", "code"), [
    ({"since": "yesterday"}, "invalid_since"),
    ({"since": "-5"}, "invalid_since"),
    ({"since": "nan"}, "invalid_since"),
    ({"since": ""}, "invalid_since"),  # given, but empty
    ({"group_by": "model"}, "invalid_group_by"),
    ({"group_by": "client,client"}, "invalid_group_by"),
    ({"group_by": ""}, None),  # empty: the default, client
])
async def test_bad_parameters_are_400_json_errors(params: dict[str, str],
                                                  code: str | None) -> None:
    async with client() as c:
        resp = await get(c, ADMIN, **params)
    if code is None:
        assert resp.status_code == 200
        return
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == code and resp.json()["error"]["type"]


async def test_a_store_that_fails_is_503() -> None:
    store = ledger()
    store.down = True
    async with client(store=store) as c:
        resp = await get(c, ADMIN)
    assert resp.status_code == 503
    assert resp.json()["error"]["code"] == "limits_store_unavailable"


def test_the_openapi_document_lists_the_usage_endpoint_and_its_errors() -> None:
    from meshroute_middleware.http.openapi import openapi_document

    api = UsageAPI(None, CLIENTS)
    doc = openapi_document()
    for route in api.routes():
        assert "get" in doc["paths"][route.path]  # type: ignore[attr-defined]
    responses = doc["paths"]["/v1/usage"]["get"]["responses"]
    assert set(responses) == {"200", "400", "401", "403", "503"}
