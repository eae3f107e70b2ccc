"""GatewayAPI's /dashboard carries the current /v1/routing and /v1/nodes documents, safely
inside its <script>, and /v1/routing counts the chat requests."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette

from meshroute_middleware.api import GatewayAPI
from meshroute_middleware.core import parse_node
from meshroute_middleware.mesh import Mesh
from meshroute_middleware.middleware import MeshRouteMiddleware, MiddlewareConfig

pytestmark = pytest.mark.anyio
HOSTILE = "</script><script>alert(1)</script><!-- & >"
SNAPSHOT = re.compile(r'<script id="snapshot" type="application/json">(.*?)</script>', re.S)


async def _answering(scope: Any, receive: Any, send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b'{"usage": {"completion_tokens": 3}}'})


def _gateway(warnings: tuple[str, ...] = ()) -> MeshRouteMiddleware:
    mw = MeshRouteMiddleware(_answering, MiddlewareConfig(mode="annotate"))
    api = GatewayAPI(Mesh(mw.router, mw.telemetry), warnings=warnings, cache_s=0.0)
    mw.app = Starlette(routes=api.routes())
    mw.router.upsert_node(parse_node({"node_id": "a", "model": "m", "start": 0, "end": 9,
                                      "layers": 10, "url": "http://127.0.0.1:1", "tps": 10}))
    return mw


async def test_the_dashboard_carries_the_routing_and_nodes_documents() -> None:
    app = _gateway()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as client:
        assert (await client.post("/v1/chat/completions", json={"model": "m"})).status_code == 200
        page = (await client.get("/dashboard")).text
        routing = (await client.get("/v1/routing")).json()
        nodes = (await client.get("/v1/nodes")).json()["nodes"]
    match = SNAPSHOT.search(page)
    assert match is not None
    snapshot = json.loads(match.group(1))
    assert snapshot["nodes"] == nodes
    def table(doc: dict[str, Any]) -> list[tuple[str, int]]:  # shares are drawn anew
        return [(r["signature"], r["samples"]) for r in doc["models"]["m"]["candidates"]]

    assert table(snapshot["routing"]) == table(routing) and len(table(routing)) == 1
    assert snapshot["routing"]["requests"] == routing["requests"] == {"answered": 1, "failed": 0}


async def test_no_value_inside_the_snapshot_can_end_its_script() -> None:
    app = _gateway(warnings=(HOSTILE,))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as client:
        page = (await client.get("/dashboard")).text
    assert HOSTILE not in page and "alert(1)</script>" not in page
    match = SNAPSHOT.search(page)
    assert match is not None and "<" not in match.group(1) and "&" not in match.group(1)
    assert json.loads(match.group(1))["routing"]["config"]["warnings"] == [HOSTILE]
