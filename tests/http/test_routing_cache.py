"""/v1/routing's cache (http/gateway_api.py): computed at most once per `cache_s`, except that
a node joining or leaving shows at once (a node agent's DELETE must not linger a second)."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette

from meshroute_middleware.api import GatewayAPI
from meshroute_middleware.core import parse_node
from meshroute_middleware.mesh import Mesh
from meshroute_middleware.middleware import MeshRouteMiddleware, MiddlewareConfig

pytestmark = pytest.mark.anyio


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _node(node_id: str) -> dict[str, object]:
    return {"node_id": node_id, "model": "m", "start": 0, "end": 9, "layers": 10,
            "url": f"http://127.0.0.{len(node_id)}:1", "tps": 10}


async def test_the_cache_holds_a_second_but_not_past_a_node_joining_or_leaving() -> None:
    async def nothing(scope: object, receive: object, send: object) -> None:
        raise AssertionError("no chat here")

    clock = Clock()
    mw = MeshRouteMiddleware(nothing, MiddlewareConfig(mode="annotate"))
    mesh = Mesh(mw.router, mw.telemetry)
    mw.app = Starlette(routes=GatewayAPI(mesh, cache_s=1.0, clock=clock).routes())
    mesh.upsert(parse_node(_node("a")))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw),
                                 base_url="http://t") as client:
        async def heads() -> list[str]:
            doc = (await client.get("/v1/routing")).json()
            return sorted(r["head"] for m in doc["models"].values() for r in m["candidates"])

        assert await heads() == ["a"]
        first = (await client.get("/v1/routing")).content
        clock.now += 0.5
        assert (await client.get("/v1/routing")).content == first  # cached
        mesh.upsert(parse_node(_node("bb")))
        assert await heads() == ["a", "bb"]  # joined: shown within the cache's second
        mesh.remove("a")
        assert await heads() == ["bb"]  # left: gone at once
        mesh.remove("bb")
        assert await heads() == []
