"""The tracker's own HTTP endpoints (the app MeshRouteMiddleware wraps in `meshroute serve`)."""

from __future__ import annotations

import hmac
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from .core import InvalidNodeError
from .events import sse
from .httperrors import error_body
from .mesh import Mesh
from .openapi import openapi_document
from .telemetry import CONTENT_TYPE

MAX_NODE_BODY = 64 * 1024
_DASHBOARD = (Path(__file__).parent / "static" / "dashboard.html").read_text()


def error_response(status: int, message: str, code: str, headers: dict[str, str] | None = None,
                   **extra: Any) -> Response:
    """An OpenAI-style JSON error response."""
    return Response(error_body(status, message, code, **extra), status, headers=headers,
                    media_type="application/json")


class GatewayAPI:
    """Endpoints over a Mesh; `node_token` guards node writes when set."""

    def __init__(self, mesh: Mesh, node_token: str | None = None) -> None:
        self.mesh, self.node_token = mesh, node_token
        self.router, self.telemetry = mesh.router, mesh.telemetry

    def routes(self) -> list[Route]:
        """The routes, for a Starlette app."""
        return [
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_unrouted, methods=["POST"]),
            # one route per path, so that a 405's Allow header lists every method
            Route("/v1/nodes", self.nodes, methods=["GET", "POST"]),
            Route("/v1/nodes/{node_id:path}", self.delete_node, methods=["DELETE"]),
            Route("/v1/routing", self.routing, methods=["GET"]),
            Route("/v1/routing/events", self.events, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            Route("/healthz", self.health, methods=["GET"]),
            Route("/dashboard", self.dashboard, methods=["GET"]),
            Route("/openapi.json", self.openapi, methods=["GET"]),
        ]

    async def models(self, request: Request) -> Response:
        """Every model the router can route, OpenAI list shape."""
        per_model: dict[str, int] = {}
        for node in self.mesh.nodes():
            per_model[node.model] = per_model.get(node.model, 0) + 1
        data = [{"id": m, "object": "model", "owned_by": "meshroute", "nodes": n}
                for m, n in sorted(per_model.items())]
        return JSONResponse({"object": "list", "data": data})

    async def chat_unrouted(self, request: Request) -> Response:
        """Only reached without MeshRouteMiddleware in front (it serves POSTs here)."""
        return error_response(503, "this app routes chat requests only behind "
                              "MeshRouteMiddleware", "not_routed")

    async def nodes(self, request: Request) -> Response:
        """GET lists the node records, POST registers one."""
        if request.method == "POST":
            return await self.post_node(request)
        return await self.list_nodes(request)

    async def list_nodes(self, request: Request) -> Response:
        """The topology's node records."""
        nodes = sorted(self.mesh.nodes(), key=lambda n: (n.model, n.node_id))
        return JSONResponse({"nodes": [n.to_dict() for n in nodes]})

    def _authorized(self, request: Request) -> bool:
        if not self.node_token:
            return True
        given = request.headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {self.node_token}".encode())

    async def post_node(self, request: Request) -> Response:
        """Register or refresh a node record."""
        if not self._authorized(request):
            self.mesh.reject("http", "missing or wrong bearer token")
            return error_response(401, "a valid bearer token is required to register nodes",
                                  "invalid_token")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_NODE_BODY:
                return error_response(413, "node record too large", "request_too_large")
        try:
            data = json.loads(body)
        except ValueError:
            self.mesh.reject("http", "invalid JSON")
            return error_response(400, "request body is not valid JSON", "invalid_json")
        try:
            record, change = self.mesh.upsert_raw(data, "http")
        except InvalidNodeError as exc:
            return error_response(400, f"invalid node record: {exc}", "invalid_node")
        return JSONResponse({"node": record.to_dict(), "change": change},
                            status_code=201 if change == "join" else 200)

    async def delete_node(self, request: Request) -> Response:
        """Remove a node."""
        if not self._authorized(request):
            self.mesh.reject("http", "missing or wrong bearer token")
            return error_response(401, "a valid bearer token is required to remove nodes",
                                  "invalid_token")
        node_id = request.path_params["node_id"]
        if not self.mesh.remove(node_id):
            return error_response(404, f"no node {node_id!r}", "node_not_found")
        return JSONResponse({"removed": node_id})

    async def routing(self, request: Request) -> Response:
        """The learned routing table, optionally for one model."""
        model = request.query_params.get("model")
        if model is not None and model not in self.router.models():
            return error_response(404, f"model {model!r} is not served by any known route",
                                  "model_not_found")
        return JSONResponse(self.router.routing_table(model))

    async def events(self, request: Request) -> Response:
        """Server-Sent Events: history after ?since= (or Last-Event-ID), then live."""
        raw = request.query_params.get("since") or request.headers.get("last-event-id") or "0"
        try:
            since = int(raw)
        except ValueError:
            return error_response(400, "'since' must be an event id (integer)", "invalid_since")

        async def stream() -> AsyncIterator[bytes]:
            yield b": meshroute routing events\n\n"
            async for event in self.telemetry.events.subscribe(since):
                yield sse(event)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})

    async def metrics(self, request: Request) -> Response:
        """Prometheus text exposition."""
        return Response(self.telemetry.render(), media_type=CONTENT_TYPE)

    async def dashboard(self, request: Request) -> Response:
        """The live "Routing (learned)" panel and call wall (ADR-0021's dashboard)."""
        return HTMLResponse(_DASHBOARD)

    async def openapi(self, request: Request) -> Response:
        """The OpenAPI document of these endpoints (meshroute_middleware/openapi.py)."""
        return JSONResponse(openapi_document())

    async def health(self, request: Request) -> Response:
        """Liveness."""
        return JSONResponse({"ok": True, "models": self.router.models(),
                             "tracker": self.router.stats.origin})


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's HTTP errors (404, 405, ...) as OpenAI-style JSON."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    if status == 404:
        return error_response(404, f"no such endpoint: {request.method} {request.url.path}",
                              "not_found")
    if status == 405:
        return error_response(405, f"method {request.method} not allowed on "
                              f"{request.url.path}", "method_not_allowed",
                              headers=getattr(exc, "headers", None))  # Allow (RFC 9110)
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    return error_response(status, str(detail), "http_error")


async def server_error(request: Request, exc: Exception) -> Response:
    """Any unexpected exception: logged by the server, a JSON 500 for the client."""
    return error_response(500, "internal error in meshroute; see the server log",
                          "internal_error")


def build_api_app(api: GatewayAPI, extra_routes: list[Route] | None = None) -> Starlette:
    """The inner Starlette app: endpoints plus OpenAI-style error handlers."""
    return Starlette(routes=api.routes() + list(extra_routes or []),
                     exception_handlers={HTTPException: http_error, 500: server_error})
