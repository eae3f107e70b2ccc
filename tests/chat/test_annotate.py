"""Annotate mode: the wrapped app serves the request itself, told the plan."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route

from meshroute_middleware.core import RouterConfig, parse_node
from meshroute_middleware.middleware import MeshRouteMiddleware, MiddlewareConfig, build_router

from ..conftest import FakeClock

pytestmark = pytest.mark.anyio


def make_app(seen: list[dict[str, Any]], failing_head: str | None = None) -> Starlette:
    async def chat(request: Request) -> Response:
        plan = json.loads(request.headers.get("x-meshroute-plan", '[{"node_id": null}]'))
        seen.append({"plan": plan, "state": request.scope.get("state", {}).get("meshroute"),
                     "route": request.headers.get("x-meshroute-route")})
        if plan[0]["node_id"] == failing_head:
            return JSONResponse({"error": {"message": "boom"}}, status_code=502)
        body = await request.json()
        return JSONResponse({"choices": [{"message": {"content": body["model"]}}],
                             "usage": {"completion_tokens": 40, "prompt_tokens": 1}})

    async def other(request: Request) -> Response:
        return PlainTextResponse("untouched")

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"]),
                             Route("/other", other, methods=["GET", "POST"])])


def wrap(app: Starlette) -> MeshRouteMiddleware:
    """The app behind the middleware, routing on a clock that stands still: the statistics
    read afterwards are exactly what was recorded, however slow the machine."""
    router = build_router(RouterConfig(explore_share=0.0), seed=1, clock=FakeClock())
    mw = MeshRouteMiddleware(app, MiddlewareConfig(mode="annotate"), router=router)
    for node_id, tps in (("a", 30.0), ("b", 10.0)):
        mw.router.upsert_node(parse_node({"node_id": node_id, "model": "m", "start": 0,
                                          "end": 9, "layers": 10,
                                          "url": "http://127.0.0.1:1", "tps": tps}))
    return mw


async def test_annotate_tells_the_app_and_measures() -> None:
    seen: list[dict[str, Any]] = []
    mw = wrap(make_app(seen))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw),
                                 base_url="http://t") as client:
        resp = await client.post("/v1/chat/completions", json={"model": "m"},
                                 headers={"x-meshroute-plan": "[spoofed]"})
        assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == "m"
        assert resp.headers["x-meshroute-route"] == "m|a[0-9]"
        assert resp.headers["x-meshroute-mode"] == "greedy-fallback"
        assert seen[0]["plan"][0]["node_id"] == "a"  # the client's header was replaced
        assert seen[0]["state"]["signature"] == "m|a[0-9]"
        assert (await client.get("/other")).text == "untouched"
        resp = await client.post("/v1/chat/completions", json={"model": "not-in-mesh"})
        assert "x-meshroute-route" not in resp.headers  # the app serves it by itself
    row = mw.router.routing_table()["models"]["m"]["candidates"][0]
    assert row["samples"] == 1 and row["tps"] > 0


async def test_annotate_falls_back_before_the_first_byte() -> None:
    seen: list[dict[str, Any]] = []
    mw = wrap(make_app(seen, failing_head="a"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw),
                                 base_url="http://t") as client:
        resp = await client.post("/v1/chat/completions", json={"model": "m"})
        assert resp.status_code == 200
        assert resp.headers["x-meshroute-route"] == "m|b[0-9]"
        assert [s["plan"][0]["node_id"] for s in seen] == ["a", "b"]
        rows = {r["head"]: r for r in mw.router.routing_table()["models"]["m"]["candidates"]}
        assert rows["a"]["failures"] == 1.0 and rows["b"]["samples"] == 1


async def test_annotate_with_every_route_failing_relays_the_last_answer() -> None:
    seen: list[dict[str, Any]] = []
    app = make_app(seen, failing_head="a")
    mw = wrap(app)
    mw.router.remove_node("b")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw),
                                 base_url="http://t") as client:
        resp = await client.post("/v1/chat/completions", json={"model": "m"})
        assert resp.status_code == 502 and resp.headers["x-meshroute-route"] == "m|a[0-9]"


async def test_an_app_with_the_middleware_can_serve_the_routing_endpoints_too() -> None:
    from meshroute_middleware.api import GatewayAPI
    from meshroute_middleware.mesh import Mesh

    seen: list[dict[str, Any]] = []
    app = make_app(seen)
    mw = wrap(app)
    for route in GatewayAPI(Mesh(mw.router, mw.telemetry)).routes():
        if route.path != "/v1/chat/completions":
            app.router.routes.append(route)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw),
                                 base_url="http://t") as client:
        await client.post("/v1/chat/completions", json={"model": "m"})
        table = (await client.get("/v1/routing")).json()
        assert table["models"]["m"]["candidates"][0]["samples"] == 1
        assert "meshroute_decisions_total" in (await client.get("/metrics")).text


async def test_an_app_that_edits_its_plan_does_not_edit_the_next_requests() -> None:
    plans: list[Any] = []

    async def chat(request: Request) -> Response:
        state = request.scope["state"]["meshroute"]
        plans.append(json.loads(json.dumps(state["plan"])))
        state["plan"][0]["node_id"] = "scribbled"  # the app's own copy to do with as it likes
        state["plan"].append({"node_id": "extra"})
        return JSONResponse({"usage": {"completion_tokens": 40}})

    mw = wrap(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])]))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw),
                                 base_url="http://t") as client:
        for _ in range(3):
            resp = await client.post("/v1/chat/completions", json={"model": "m"})
            assert resp.status_code == 200
    assert all(len(p) == 1 and p[0]["node_id"] in ("a", "b") for p in plans)


async def test_annotate_serves_embeddings_with_their_own_statistics() -> None:
    """A library user's app behind the middleware gets /v1/embeddings with the plan, only
    on routes declaring `embeddings`; a 502 from the first falls back; the samples go to
    the embeddings Router, never the chat Router."""
    seen: list[dict[str, Any]] = []

    async def embeddings(request: Request) -> Response:
        plan = json.loads(request.headers["x-meshroute-plan"])
        seen.append({"head": plan[0]["node_id"], "path": request.url.path})
        if plan[0]["node_id"] == "bad":
            return JSONResponse({"error": {"message": "boom"}}, status_code=502)
        return JSONResponse({"object": "list", "data": [{"embedding": [1.0]}] * 3})

    app = Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])
    router = build_router(RouterConfig(explore_share=0.0), seed=1, clock=FakeClock())
    mw = MeshRouteMiddleware(app, MiddlewareConfig(mode="annotate"), router=router)
    for node_id, tps, caps in (("bad", 90.0, ["embeddings"]), ("good", 30.0, ["embeddings"]),
                               ("chat", 60.0, [])):
        mw.router.upsert_node(parse_node({"node_id": node_id, "model": "m", "start": 0,
                                          "end": 9, "layers": 10, "caps": caps,
                                          "url": "http://127.0.0.1:1", "tps": tps}))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw),
                                 base_url="http://t") as client:
        resp = await client.post("/v1/embeddings", json={"model": "m", "input": ["a", "b", "c"]})
    assert resp.status_code == 200 and resp.headers["x-meshroute-route"] == "m|good[0-9]"
    assert seen == [{"head": "bad", "path": "/v1/embeddings"},
                    {"head": "good", "path": "/v1/embeddings"}]
    rows = {r["head"]: r for r in mw.embeddings_router.routing_table("m")["models"]["m"][
        "candidates"]}
    assert (rows["good"]["samples"], rows["bad"]["failures"]) == (1, 1)
    assert mw.embeddings_router.topology is mw.router.topology  # the same nodes, always
    chat = mw.router.routing_table("m")["models"]["m"]["candidates"]
    assert all(r["successes"] == 0 and r["failures"] == 0 for r in chat)


async def test_annotate_leaves_embeddings_to_the_app_when_no_node_declares_them() -> None:
    """Before embeddings were routed the app answered them itself; it still does when no
    node of the model declares `embeddings`."""
    async def embeddings(request: Request) -> Response:
        return JSONResponse({"object": "list", "served_by": "app",
                             "plan": request.headers.get("x-meshroute-plan")})

    app = Starlette(routes=[Route("/v1/embeddings", embeddings, methods=["POST"])])
    mw = wrap(app)  # nodes a and b declare nothing
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw),
                                 base_url="http://t") as client:
        resp = await client.post("/v1/embeddings", json={"model": "m", "input": "x"})
        pinned = await client.post("/v1/embeddings",
                                   json={"model": "m", "input": "x", "route": ["a"]})
    assert resp.status_code == 200 and resp.json() == {"object": "list", "served_by": "app",
                                                       "plan": None}
    assert pinned.status_code == 400
    assert pinned.json()["error"]["code"] == "unsupported_capability"
