"""The tracker's own HTTP endpoints (the app MeshRouteMiddleware wraps in `meshroute serve`):
the model listings, node records, the learned routing table and its events, metrics, health,
the dashboard and the OpenAPI document."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from meshroute_middleware.core import InvalidNodeError, Router, UnknownModelError
from meshroute_middleware.core.capabilities import CAPABILITIES
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.endpoints import DIALECT_PATHS
from meshroute_middleware.http.access import has_bearer, is_loopback_client, peer_of
from meshroute_middleware.http.errors import (
    ErrorAnswer,
    HttpError,
    answer,
    http_error,
    server_error,
)
from meshroute_middleware.http.listings import (
    embeddings_table,
    provider_models,
    routable_model,
    script_safe_json,
)
from meshroute_middleware.http.openapi import openapi_document
from meshroute_middleware.mesh import Mesh, MeshFullError
from meshroute_middleware.telemetry.events import sse
from meshroute_middleware.telemetry.metrics import CONTENT_TYPE

__all__ = ["CACHE_S", "MAX_NODE_BODY", "GatewayAPI", "build_api_app"]

log = logging.getLogger("meshroute.api")
MAX_NODE_BODY = 64 * 1024
CACHE_S = 1.0  # /v1/routing and /metrics are computed at most once a second (issue 11)
_DASHBOARD = (Path(__file__).parent.parent / "static" / "dashboard.html").read_text()
# The page's slot for the first /v1/routing and /v1/nodes documents, so that its first paint
# shows the routes without waiting for a poll.
_SNAPSHOT_SLOT = '<script id="snapshot" type="application/json">null</script>'


class GatewayAPI:
    """Endpoints over a Mesh. Node writes: with `node_token`, only with that bearer token;
    without, only from loopback clients. `warnings` are shown in /v1/routing's config;
    `providers`: the provider routes /v1/models lists beside the mesh models."""

    def __init__(self, mesh: Mesh, node_token: str | None = None, *,
                 warnings: Sequence[str] = (), cache_s: float = CACHE_S,
                 clock: Callable[[], float] = time.monotonic,
                 providers: ProviderRouter | None = None,
                 embeddings_router: Router | None = None,
                 embeddings_providers: ProviderRouter | None = None,
                 admin_token: str | None = None,
                 first_paint: Callable[[Request], Awaitable[dict[str, Any]]] | None = None,
                 ) -> None:
        self.mesh, self.node_token = mesh, node_token
        self.first_paint = first_paint  # more of the dashboard's first paint (app/firstpaint)
        self.admin_token = admin_token  # who sees each client's series in /metrics
        self.providers = providers
        # embeddings' statistics (mesh routes, provider routes), shown apart from chat's
        self.embeddings_router, self.embeddings_providers = embeddings_router, embeddings_providers
        self.router, self.telemetry = mesh.router, mesh.telemetry
        self.warnings = list(warnings)
        self.cache_s, self.clock = cache_s, clock
        # query -> (at, the nodes' digest, body)
        self._routing: dict[str | None, tuple[float, str, bytes]] = {}

    def routes(self) -> list[Route]:
        """The routes, for a Starlette app."""
        return [
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_unrouted, methods=["POST"]),
            # the other APIs over the chat path (chat/dialects), for the 405 of other methods
            *(Route(path, self.chat_unrouted, methods=["POST"]) for path in sorted(DIALECT_PATHS)),
            # the other routed paths: so that another method there is a 405, not a 404
            Route("/v1/embeddings", self.chat_unrouted, methods=["POST"]),
            Route("/v1/completions", self.chat_unrouted, methods=["POST"]),
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
        """Every model the gateway can route, OpenAI list shape: the mesh models (`kind`
        mesh, with their node count), then, with provider routes, the chains a client may ask
        for (`auto`, `auto:<profile>`; kind chain), the provider models (kind provider) and
        the aliases (kind alias)."""
        return JSONResponse({"object": "list", "data": self._models()})

    async def model(self, request: Request) -> Response:
        """`GET /v1/models/{id}` (`client.models.retrieve`): one model as /v1/models lists it,
        or a name an alias or an `auto:<strategy>` accepts; 404 model_not_found otherwise."""
        model_id = request.path_params["model_id"]
        row = next((m for m in self._models() if m["id"] == model_id), None)
        if row is None and self.providers is not None:
            row = routable_model(self.providers.cfg, model_id)
        if row is None:
            return answer(ErrorAnswer.of(UnknownModelError(f"no model {model_id[:200]!r}")))
        return JSONResponse({"created": 0, **row})

    def _mesh_caps(self, model: str) -> list[str]:
        """The capabilities some route of a mesh model has (each: a route whose every hop has
        it)."""
        return [c for c in CAPABILITIES if self.router.serves(model, frozenset({c}))]

    def _models(self) -> list[dict[str, Any]]:
        per_model: dict[str, int] = {}
        for node in self.mesh.nodes():
            per_model[node.model] = per_model.get(node.model, 0) + 1
        data = [{"id": m, "object": "model", "owned_by": "meshroute", "kind": "mesh",
                 "nodes": n, "capabilities": self._mesh_caps(m)}
                for m, n in sorted(per_model.items())]
        if self.providers is not None:
            data += provider_models(self.providers.cfg)
        return data

    async def chat_unrouted(self, request: Request) -> Response:
        """Only reached without MeshRouteMiddleware in front (it serves POSTs here)."""
        return HttpError.NOT_ROUTED.response(
            "this app routes chat requests only behind "
            "MeshRouteMiddleware")

    async def nodes(self, request: Request) -> Response:
        """GET lists the node records, POST registers one."""
        if request.method == "POST":
            return await self.post_node(request)
        return await self.list_nodes(request)

    async def list_nodes(self, request: Request) -> Response:
        """The topology's node records."""
        return JSONResponse({"nodes": self._node_records()})

    def _node_records(self) -> list[dict[str, Any]]:
        """The node records, by model and id."""
        nodes = sorted(self.mesh.nodes(), key=lambda n: (n.model, n.node_id))
        return [n.to_dict() for n in nodes]

    def _refuse_write(self, request: Request, what: str) -> Response | None:
        """None when this client may change the mesh, else the 401 to answer (counted)."""
        client = peer_of(request)
        if self.node_token:
            if has_bearer(request, self.node_token):
                return None
            self.mesh.reject("http", f"{client}: missing or wrong bearer token")
            return HttpError.INVALID_TOKEN.response(f"a valid bearer token is required to {what}")
        if is_loopback_client(request):
            return None
        self.mesh.reject("http", f"{client}: node write from a non-loopback address")
        log.warning("refused a node write from %s: no --node-token is set, so only loopback "
                    "clients may change the mesh", client)
        return HttpError.UNAUTHORIZED.response(
            f"only loopback clients may {what} on this tracker "
            "(start it with --node-token to allow others)")

    async def post_node(self, request: Request) -> Response:
        """Register or refresh a node record."""
        refusal = self._refuse_write(request, "register nodes")
        if refusal is not None:
            return refusal
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_NODE_BODY:
                return HttpError.REQUEST_TOO_LARGE.response("node record too large")
        try:
            data = json.loads(body)
        except ValueError:
            self.mesh.reject("http", "invalid JSON")
            return HttpError.INVALID_JSON.response("request body is not valid JSON")
        try:
            record, change = self.mesh.upsert_raw(data, "http")
        except MeshFullError as exc:
            return answer(ErrorAnswer.of(exc))
        except InvalidNodeError as exc:
            return answer(ErrorAnswer.of(exc, f"invalid node record: {exc}"))
        return JSONResponse({"node": record.to_dict(), "change": change},
                            status_code=201 if change == "join" else 200)

    async def delete_node(self, request: Request) -> Response:
        """Remove a node."""
        refusal = self._refuse_write(request, "remove nodes")
        if refusal is not None:
            return refusal
        node_id = request.path_params["node_id"]
        if not self.mesh.remove(node_id):
            return HttpError.NODE_NOT_FOUND.response(f"no node {node_id!r}")
        return JSONResponse({"removed": node_id})

    async def routing(self, request: Request) -> Response:
        """The learned routing table, optionally for one model."""
        model = request.query_params.get("model")
        if model is not None and model not in self.router.models():
            return HttpError.MODEL_NOT_FOUND.response(
                f"model {model!r} is not served by any known route")
        return Response(self._routing_body(model), media_type="application/json")

    def _routing_body(self, model: str | None) -> bytes:
        """The routing table as JSON, computed at most once per `cache_s` per query and set
        of nodes (a node that joined or left shows at once). A worker of `--workers N`
        shares it with the others (telemetry/workers.py), as /metrics."""
        now, members = self.clock(), self._members()
        workers = self.telemetry.workers
        if workers is not None:
            name = "routing.json" if model is None else f"routing-{_digest([model])}.json"
            return workers.shared(name, now, self.cache_s, members,
                                  lambda: self._routing_table(model))
        cached = self._routing.get(model)
        if cached is not None and now - cached[0] < self.cache_s and cached[1] == members:
            return cached[2]
        body = self._routing_table(model)
        if len(self._routing) > len(self.router.topology.models()) + 1:  # gone models
            self._routing.clear()
        self._routing[model] = (now, members, body)
        return body

    def _members(self) -> str:
        """A digest of the node ids in the topology: the same in every worker holding the
        same nodes."""
        return _digest(sorted(n.node_id for n in self.router.topology.nodes()))

    def _routing_table(self, model: str | None) -> bytes:
        """The routing table as JSON, computed now; a route's `in_flight` is the whole
        gateway's (every worker's own attempts, or what its nodes report holding if more)."""
        table = self.router.routing_table(model)
        flying = self.telemetry.route_in_flight()
        if flying:
            for entry in table["models"].values():
                for row in entry["candidates"]:
                    row["in_flight"] = max(row["in_flight"], flying.get(row["signature"], 0))
        if self.embeddings_router is not None:
            table["embeddings"] = embeddings_table(self.embeddings_router, model,
                                                   self.embeddings_providers,
                                                   self.telemetry.route_in_flight("embeddings"))
        if self.warnings:
            table["config"]["warnings"] = self.warnings
        if self.telemetry.requests is not None:
            table["requests"] = self.telemetry.requests.to_dict()
        table["objectives"] = dict(self.telemetry.objectives)  # requests routed by each
        return json.dumps(table, ensure_ascii=False, allow_nan=False,
                         separators=(",", ":")).encode()

    async def events(self, request: Request) -> Response:
        """Server-Sent Events: history after ?since= (or Last-Event-ID), then live."""
        raw = request.query_params.get("since") or request.headers.get("last-event-id") or "0"
        try:
            since = int(raw)
        except ValueError:
            return HttpError.INVALID_SINCE.response("'since' must be an event id (integer)")

        async def stream() -> AsyncIterator[bytes]:
            yield b": meshroute routing events\n\n"
            async for event in self.telemetry.events.subscribe(since):
                yield sse(event)

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"cache-control": "no-cache"})

    async def metrics(self, request: Request) -> Response:
        """Prometheus text exposition: each client's series for a loopback peer or the admin
        token's bearer, their sums without the `client` label for anyone else (issue 32)."""
        return Response(self.telemetry.render_cached(self.clock(), self.cache_s,
                                                     self._sees_clients(request)),
                        media_type=CONTENT_TYPE)

    def _sees_clients(self, request: Request) -> bool:
        """Whether this request may see what each client spent."""
        return is_loopback_client(request) or has_bearer(request, self.admin_token)

    async def dashboard(self, request: Request) -> Response:
        """The live "Routing (learned)" panel and call wall (ADR-0021's dashboard), with the
        current /v1/routing and /v1/nodes documents inside: its first paint shows them."""
        nodes = json.dumps(self._node_records(), ensure_ascii=False, allow_nan=False)
        more = {} if self.first_paint is None else await self.first_paint(request)
        tail = "".join(f",{json.dumps(k)}:{json.dumps(v, ensure_ascii=False, allow_nan=False)}"
                       for k, v in more.items())
        snapshot = (b'{"routing":' + self._routing_body(None) + b',"nodes":' + nodes.encode()
                    + tail.encode() + b"}")
        return HTMLResponse(_DASHBOARD.replace(_SNAPSHOT_SLOT, _SNAPSHOT_SLOT.replace(
            "null", script_safe_json(snapshot))))

    async def openapi(self, request: Request) -> Response:
        """The OpenAPI document of these endpoints (http/openapi.py)."""
        return JSONResponse(openapi_document())

    async def health(self, request: Request) -> Response:
        """Liveness: 200 `{"ok": true, ...}`, or 503 with `ok` false and `degraded` naming
        each background service that failed and is waiting to restart (app/supervise.py)."""
        body: dict[str, Any] = {"ok": True, "models": self.router.models(),
                                "tracker": self.router.stats.origin}
        degraded = self.telemetry.services.degraded()
        if not degraded:
            return JSONResponse(body)
        return JSONResponse({**body, "ok": False, "degraded": degraded},
                            HttpError.DEGRADED.status)


def build_api_app(api: GatewayAPI, extra_routes: list[Route] | None = None) -> Starlette:
    """The inner Starlette app: endpoints plus OpenAI-style error handlers."""
    return Starlette(routes=api.routes() + list(extra_routes or []),
                     exception_handlers={HTTPException: http_error, 500: server_error})


def _digest(parts: Sequence[str]) -> str:
    """A short hex digest of `parts`, stable across processes (unlike hash())."""
    return hashlib.blake2b("\n".join(parts).encode(), digest_size=8).hexdigest()
