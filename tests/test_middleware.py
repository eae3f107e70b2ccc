"""MeshRouteMiddleware used as the README shows, and its error mapping."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.types import Receive, Scope, Send

from meshroute_middleware.core import RouterConfig, parse_node
from meshroute_middleware.middleware import MeshRouteMiddleware, MiddlewareConfig

pytestmark = pytest.mark.anyio


def node(node_id: str) -> Any:
    return parse_node({"node_id": node_id, "model": "m", "start": 0, "end": 9, "layers": 10,
                       "url": "http://127.0.0.1:1", "tps": 10.0})


async def answering_app(scope: Scope, receive: Receive, send: Send) -> None:
    await receive()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"usage": {"completion_tokens": 9}}'})


async def raising_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("the app is broken")


async def test_the_readme_way_builds_its_own_router() -> None:
    app = MeshRouteMiddleware(answering_app, MiddlewareConfig(mode="annotate"))
    app.router.upsert_node(node("a"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as client:
        resp = await client.post("/v1/chat/completions", json={"model": "m"})
    assert resp.status_code == 200 and resp.headers["x-meshroute-route"] == "m|a[0-9]"
    assert app.router.routing_table()["models"]["m"]["candidates"][0]["samples"] == 1


def test_the_middleware_config_holds_no_router_settings_to_ignore() -> None:
    with pytest.raises(TypeError):
        MiddlewareConfig(router=RouterConfig())  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="mode"):
        MiddlewareConfig(mode="proxy")  # type: ignore[arg-type]


async def test_annotate_with_an_app_failing_on_every_route_is_502_listing_them() -> None:
    app = MeshRouteMiddleware(raising_app, MiddlewareConfig(mode="annotate"))
    app.router.upsert_node(node("a"))
    app.router.upsert_node(node("b"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as client:
        resp = await client.post("/v1/chat/completions", json={"model": "m"})
    assert resp.status_code == 502, resp.text  # issue 24: the routes failed upstream (was 503)
    err = resp.json()["error"]
    assert err["code"] == "upstream_failed"
    routes = {r["route"]: r["reason"] for r in err["routes"]}
    assert routes == {"m|a[0-9]": "app_error", "m|b[0-9]": "app_error"}
    assert resp.headers["x-meshroute-route"] in routes
    rows = app.router.routing_table()["models"]["m"]["candidates"]
    assert all(r["last_error"] == "app_error" and r["in_flight"] == 0 for r in rows)
