"""Gateway logic in-process: httpx over ASGI, heads are in-memory ASGI apps."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import httpx
import pytest

from meshroute_middleware.app.gateway import Gateway, build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig
from meshroute_middleware.forwarding.client import ForwardTimeouts
from meshroute_middleware.forwarding.memory import ASGIForwarder

from ..conftest import FakeClock
from ..upstream import FakeChat

pytestmark = pytest.mark.anyio
MODEL = "m"


def node(node_id: str, start: int, end: int, port: int, tps: float = 10.0,
         layers: int = 40) -> dict[str, Any]:
    return {"node_id": node_id, "model": MODEL, "start": start, "end": end, "layers": layers,
            "url": f"http://127.0.0.1:{port}", "tps": tps}


class Mesh:
    """A gateway over in-memory heads, routing on a clock that stands still: the statistics
    read afterwards are exactly what was recorded, however slow the machine."""

    def __init__(self, heads: dict[int, FakeChat], **settings: Any) -> None:
        base = ServeSettings(mdns=False, seed=7, router=RouterConfig(explore_share=0.0))
        self.settings = replace(base, **settings)
        apps = {f"http://127.0.0.1:{p}": h.app() for p, h in heads.items()}
        forwarder = ASGIForwarder(apps, ForwardTimeouts(first_byte_s=0.5))
        self.gateway: Gateway = build_gateway(self.settings, forwarder=forwarder,
                                              clock=FakeClock())
        self.heads = heads

    def add(self, *records: dict[str, Any]) -> None:
        for r in records:
            self.gateway.mesh.upsert_raw(r, "test")

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.gateway.app),
                                 base_url="http://gw")


@pytest.fixture
async def two_heads() -> AsyncIterator[tuple[Mesh, httpx.AsyncClient]]:
    mesh = Mesh({1: FakeChat("fast", tokens=20), 2: FakeChat("slow", tokens=20)})
    mesh.add(node("fast", 0, 39, 1, tps=30), node("slow", 0, 39, 2, tps=10))
    async with mesh.client() as client:
        yield mesh, client


def chat(model: str = MODEL, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def in_flight(gateway: Gateway) -> int:
    """Attempts under way over every route, as /v1/routing reports them."""
    return sum(row["in_flight"] for model in gateway.router.routing_table()["models"].values()
               for row in model["candidates"])


def assert_openai_error(resp: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) >= {"message", "type", "code"}
    assert err["code"] == code
    return dict(err)


async def test_cold_start_goes_to_best_prior_and_learns(two_heads: Any) -> None:
    mesh, client = two_heads
    # forwarded as sent (else gathered from a stream to be continued: chat/gather.py)
    resp = await client.post("/v1/chat/completions", json=chat(meshroute={"continue": False}))
    assert resp.status_code == 200
    assert resp.headers["x-meshroute-route"] == "m|fast[0-39]"
    assert resp.headers["x-meshroute-mode"] == "greedy-fallback"
    assert resp.json()["choices"][0]["message"]["content"] == "from fast"
    seen = mesh.heads[1].seen[0]["headers"]
    assert json.loads(seen["x-meshroute-plan"]) == [
        {"node_id": "fast", "url": "http://127.0.0.1:1", "start_layer": 0, "end_layer": 39}]
    table = (await client.get("/v1/routing")).json()
    row = next(r for r in table["models"][MODEL]["candidates"] if r["signature"].endswith(
        "fast[0-39]"))
    assert row["samples"] == 1 and row["status"] == "proven" and row["tps"] > 0


@pytest.mark.parametrize(("body", "status", "code"), [
    (b"{not json", 400, "invalid_json"),
    (b"[1, 2]", 400, "invalid_request"),
    (b'{"messages": []}', 400, "invalid_model"),
    (b'{"model": 5}', 400, "invalid_model"),
    (b'{"model": "nope"}', 404, "model_not_found"),
    (b'{"model": "m", "route": "fast"}', 400, "invalid_route"),
    (b'{"model": "m", "route": ["ghost"]}', 400, "invalid_route"),
])
async def test_bad_requests_get_openai_errors(two_heads: Any, body: bytes, status: int,
                                              code: str) -> None:
    mesh, client = two_heads
    resp = await client.post("/v1/chat/completions", content=body)
    assert_openai_error(resp, status, code)
    assert in_flight(mesh.gateway) == 0


async def test_body_over_limit_is_413() -> None:
    mesh = Mesh({1: FakeChat()}, max_body_bytes=100)
    mesh.add(node("a", 0, 39, 1))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(pad="x" * 200))
        assert_openai_error(resp, 413, "request_too_large")

        async def chunks() -> AsyncIterator[bytes]:  # no content-length: counted as it comes
            for _ in range(5):
                yield b" " * 50

        resp = await client.post("/v1/chat/completions", content=chunks())
        assert_openai_error(resp, 413, "request_too_large")


async def test_pin_gap_and_valid_pin() -> None:
    mesh = Mesh({1: FakeChat("gpu"), 2: FakeChat("cpu")})
    mesh.add(node("gpu", 0, 21, 1, tps=30), node("cpu", 0, 39, 2, tps=8))
    async with mesh.client() as client:
        err = assert_openai_error(await client.post(
            "/v1/chat/completions", json=chat(route=["cpu", "gpu"])), 400, "invalid_route")
        assert "contiguously" in err["message"]
        err = assert_openai_error(await client.post(
            "/v1/chat/completions", json=chat(route=["gpu"])), 400, "invalid_route")
        assert "40 layers" in err["message"]
        resp = await client.post("/v1/chat/completions", json=chat(route=["gpu", "cpu"]))
        assert resp.status_code == 200
        assert resp.headers["x-meshroute-mode"] == "pinned"
        assert resp.headers["x-meshroute-route"] == "m|gpu[0-21]->cpu[22-39]"
        received = mesh.heads[1].seen[-1]
        assert "route" not in received["body"]  # meshroute's own field is not forwarded
        plan = json.loads(received["headers"]["x-meshroute-plan"])
        assert plan[1]["start_layer"] == 22 and plan[0]["node_id"] == "gpu"
        table = (await client.get("/v1/routing?model=m")).json()
        pinned = [r for r in table["models"]["m"]["candidates"] if r["samples"]]
        assert [r["signature"] for r in pinned] == ["m|gpu[0-21]->cpu[22-39]"]


async def test_no_complete_route_is_503_with_reasons() -> None:
    mesh = Mesh({1: FakeChat()})
    mesh.add(node("a", 0, 10, 1), node("b", 20, 39, 1))
    async with mesh.client() as client:
        err = assert_openai_error(await client.post("/v1/chat/completions", json=chat()),
                                  503, "no_route_available")
        assert "a" in {r["route"] for r in err["routes"]}


@pytest.mark.parametrize(("fault", "kind"), [
    ({"status": 500}, "http_5xx"),
    ({"status": 503}, "http_5xx"),
    ({"header_delay_s": 2.0}, "timeout"),
])
async def test_failing_head_falls_back_and_is_recorded(fault: dict[str, Any],
                                                       kind: str) -> None:
    mesh = Mesh({1: FakeChat("bad", **fault), 2: FakeChat("good")})
    mesh.add(node("bad", 0, 39, 1, tps=50), node("good", 0, 39, 2, tps=10))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat())
        assert resp.status_code == 200, resp.text
        assert resp.headers["x-meshroute-route"] == "m|good[0-39]"
        assert resp.headers["x-meshroute-mode"] == "fallback"
        rows = {r["head"]: r for r in (await client.get("/v1/routing")).json()
                ["models"]["m"]["candidates"]}
        assert rows["bad"]["failures"] == 1.0
        assert rows["bad"]["last_error"] == kind and rows["bad"]["samples"] == 0
        assert rows["good"]["samples"] == 1
        metrics = (await client.get("/metrics")).text
        assert f'meshroute_forward_errors_total{{kind="{kind}"}} 1.0' in metrics


async def test_refused_connection_falls_back() -> None:
    mesh = Mesh({2: FakeChat("good")})  # nothing "listens" on port 1
    mesh.add(node("dead", 0, 39, 1, tps=50), node("good", 0, 39, 2, tps=10))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat())
        assert resp.headers["x-meshroute-route"] == "m|good[0-39]"
        events = mesh.gateway.telemetry.events.history()
        outcomes = [e for e in events if e["type"] == "outcome"]
        assert [(e["head"], e["error"]) for e in outcomes] == [("dead", "connect"),
                                                                ("good", None)]


async def test_every_route_rate_limited_is_429_with_diagnostics() -> None:
    mesh = Mesh({1: FakeChat("a", status=429), 2: FakeChat("b", status=429)})
    mesh.add(node("a", 0, 39, 1), node("b", 0, 39, 2))
    async with mesh.client() as client:
        err = assert_openai_error(await client.post("/v1/chat/completions", json=chat()),
                                  429, "rate_limited")
        assert {r["route"]: r["reason"] for r in err["routes"]} == {
            "m|a[0-39]": "http_429", "m|b[0-39]": "http_429"}


async def test_a_429_beside_a_500_is_429_on_the_mesh_path() -> None:
    """issue 24: any route rate limited makes the answer 429 (was 503 unless all were 429)."""
    mesh = Mesh({1: FakeChat("a", status=429), 2: FakeChat("b", status=500)})
    mesh.add(node("a", 0, 39, 1), node("b", 0, 39, 2))
    async with mesh.client() as client:
        err = assert_openai_error(await client.post("/v1/chat/completions", json=chat()),
                                  429, "rate_limited")
        assert {r["route"] for r in err["routes"]} == {"m|a[0-39]", "m|b[0-39]"}


async def test_every_route_failing_upstream_is_502_on_the_mesh_path() -> None:
    """issue 24: routes tried and failed upstream are 502 upstream_failed (was 503)."""
    mesh = Mesh({1: FakeChat("a", status=500)})  # nothing "listens" on port 2
    mesh.add(node("a", 0, 39, 1), node("dead", 0, 39, 2))
    async with mesh.client() as client:
        err = assert_openai_error(await client.post("/v1/chat/completions", json=chat()),
                                  502, "upstream_failed")
        assert err["type"] == "server_error" and "failed upstream" in err["message"]
        assert {r["route"]: r["reason"] for r in err["routes"]} == {
            "m|a[0-39]": "http_5xx", "m|dead[0-39]": "connect"}


async def test_a_heads_own_meshroute_headers_never_reach_the_client() -> None:
    mesh = Mesh({1: FakeChat("a", extra_headers={"x-meshroute-route": "forged",
                                                 "x-meshroute-mode": "forged"})})
    mesh.add(node("a", 0, 39, 1))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat())
        assert resp.headers.get_list("x-meshroute-route") == ["m|a[0-39]"]
        assert resp.headers.get_list("x-meshroute-mode") == ["greedy-fallback"]


async def test_client_error_from_head_is_relayed_and_not_counted() -> None:
    mesh = Mesh({1: FakeChat("a", status=400)})
    mesh.add(node("a", 0, 39, 1))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat())
        assert resp.status_code == 400 and resp.headers["x-meshroute-route"] == "m|a[0-39]"
        row = (await client.get("/v1/routing")).json()["models"]["m"]["candidates"][0]
        assert row["failures"] == 0 and row["samples"] == 0 and row["in_flight"] == 0


async def test_streaming_death_ends_with_sse_error_event() -> None:
    mesh = Mesh({1: FakeChat("a", tokens=10, die_after=4)})
    mesh.add(node("a", 0, 39, 1))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json=chat(stream=True))
        assert resp.status_code == 200
        events = [line for line in resp.text.split("\n\n") if line]
        assert len(events) == 5
        assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == (
            "upstream_failed")
        row = (await client.get("/v1/routing")).json()["models"]["m"]["candidates"][0]
        assert row["failures"] == 1.0 and row["last_error"] == "stream"


async def test_stream_tokens_counted_from_chunks_or_usage() -> None:
    for usage in (False, True):
        mesh = Mesh({1: FakeChat("a", tokens=12, usage_in_stream=usage)})
        mesh.add(node("a", 0, 39, 1))
        async with mesh.client() as client:
            await client.post("/v1/chat/completions", json=chat(stream=True))
        outcome = next(e for e in mesh.gateway.telemetry.events.history()
                   if e["type"] == "outcome")
        assert outcome["completion_tokens"] == 12


async def test_nodes_endpoint_auth_validation_and_delete() -> None:
    mesh = Mesh({}, node_token="s3cret")
    async with mesh.client() as client:
        good = node("n1", 0, 39, 1)
        assert_openai_error(await client.post("/v1/nodes", json=good), 401, "invalid_token")
        auth = {"authorization": "Bearer s3cret"}
        resp = await client.post("/v1/nodes", json=good, headers=auth)
        assert resp.status_code == 201 and resp.json()["change"] == "join"
        resp = await client.post("/v1/nodes", json=good, headers=auth)
        assert resp.status_code == 200 and resp.json()["change"] == "refresh"
        for bad, why in [({**good, "start": 5, "end": 2}, "after"),
                         ({**good, "end": 40}, "below"), ({**good, "url": "ftp://x"}, "url"),
                         ({**good, "tps": 1e12}, "tps"), ({**good, "start": -1}, "negative")]:
            err = assert_openai_error(await client.post("/v1/nodes", json=bad, headers=auth),
                                      400, "invalid_node")
            assert why in err["message"]
        assert_openai_error(await client.post("/v1/nodes", content=b"{", headers=auth),
                            400, "invalid_json")
        assert [n["node_id"] for n in (await client.get("/v1/nodes")).json()["nodes"]] == ["n1"]
        models = (await client.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == ["m"]
        assert_openai_error(await client.delete("/v1/nodes/n1"), 401, "invalid_token")
        assert (await client.delete("/v1/nodes/n1", headers=auth)).status_code == 200
        assert_openai_error(await client.delete("/v1/nodes/n1", headers=auth), 404,
                            "node_not_found")
        metrics = (await client.get("/metrics")).text
        assert 'meshroute_rejected_total{source="http"} 8.0' in metrics


async def test_routing_table_shape_and_unknown_paths(two_heads: Any) -> None:
    _mesh, client = two_heads
    table = (await client.get("/v1/routing")).json()
    assert set(table) == {"config", "models", "requests", "embeddings", "objectives"}
    assert table["embeddings"] == {"unit": "inputs_per_s", "models": {}}  # no traffic yet
    assert table["requests"] == {"answered": 0, "failed": 0}  # no chat request yet
    assert table["objectives"] == {"throughput": 0, "ttft": 0, "cost": 0}
    assert table["config"]["explore_share"] == 0.0
    cand = table["models"]["m"]["candidates"][0]
    assert {"signature", "hops", "tps", "prior_tps", "coefficient", "share", "samples",
            "weight", "status"} <= set(cand)
    assert cand["hops"] == [{"node_id": "fast", "start_layer": 0, "end_layer": 39}]
    assert_openai_error(await client.get("/v1/routing?model=zzz"), 404, "model_not_found")
    assert_openai_error(await client.get("/nowhere"), 404, "not_found")
    assert_openai_error(await client.get("/v1/chat/completions"), 405, "method_not_allowed")


class _BrokenForwarder:
    """A forwarder with a bug: raises something no one planned for."""

    async def open(self, url: str, body: bytes, headers: Any) -> Any:
        raise RuntimeError("a bug")

    async def aclose(self) -> None:
        pass


async def test_an_internal_bug_is_a_json_500_and_leaks_no_in_flight() -> None:
    settings = replace(ServeSettings(), mdns=False, seed=1)
    gateway = build_gateway(settings, forwarder=_BrokenForwarder())
    gateway.mesh.upsert_raw(node("a", 0, 39, 1), "test")
    transport = httpx.ASGITransport(app=gateway.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        resp = await client.post("/v1/chat/completions", json=chat())
        assert_openai_error(resp, 500, "internal_error")
    assert in_flight(gateway) == 0


async def test_a_bug_while_choosing_is_a_json_500_too() -> None:
    settings = replace(ServeSettings(), mdns=False, seed=1)
    gateway = build_gateway(settings)
    gateway.mesh.upsert_raw(node("a", 0, 39, 1), "test")

    def broken_policy_choose(*args: Any) -> Any:
        raise ValueError("math domain error")

    gateway.router.policy.choose = broken_policy_choose  # type: ignore[method-assign]
    transport = httpx.ASGITransport(app=gateway.app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gw") as client:
        resp = await client.post("/v1/chat/completions", json=chat())
        assert_openai_error(resp, 500, "internal_error")
