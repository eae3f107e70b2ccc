"""The tracker's own HTTP endpoints (the app MeshRouteMiddleware wraps in `meshroute serve`)."""

from __future__ import annotations

import hmac
import ipaddress
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from meshroute_middleware.chat.dialects import DIALECTS
from meshroute_middleware.chat.spend import ClientSpend
from meshroute_middleware.core import InvalidNodeError, Router, UnknownModelError
from meshroute_middleware.core.capabilities import CAPABILITIES
from meshroute_middleware.core.clients import Client, find_client
from meshroute_middleware.core.clients_budget import GROUPS, usage_report
from meshroute_middleware.core.objectives import (
    DEFAULT_OBJECTIVE,
    InvalidObjectiveError,
    parse_objective,
)
from meshroute_middleware.core.providers.chain import InvalidModelError
from meshroute_middleware.core.providers.config import ProvidersConfig
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.core.providers.scoring import AUTO_ALIASES
from meshroute_middleware.http.auth import presented_keys
from meshroute_middleware.http.errors import INTERNAL_ERROR, ErrorAnswer, error_body
from meshroute_middleware.http.inference import NEEDS
from meshroute_middleware.http.openapi import openapi_document
from meshroute_middleware.http.request import DEFAULT_BODY_TIMEOUT_S, RequestError, read_body
from meshroute_middleware.mesh import Mesh, MeshFullError
from meshroute_middleware.state.limits import LimitsStoreDown
from meshroute_middleware.telemetry.events import sse
from meshroute_middleware.telemetry.metrics import CONTENT_TYPE

log = logging.getLogger("meshroute.api")
MAX_NODE_BODY = 64 * 1024
CACHE_S = 1.0  # /v1/routing and /metrics are computed at most once a second (issue 11)
_DASHBOARD = (Path(__file__).parent / "static" / "dashboard.html").read_text()
# The page's slot for the first /v1/routing and /v1/nodes documents, so that its first paint
# shows the routes without waiting for a poll.
_SNAPSHOT_SLOT = '<script id="snapshot" type="application/json">null</script>'


def error_response(status: int, message: str, code: str, headers: dict[str, str] | None = None,
                   **extra: Any) -> Response:
    """An OpenAI-style JSON error response."""
    return Response(error_body(status, message, code, **extra), status, headers=headers,
                    media_type="application/json")


def answer(error: ErrorAnswer) -> Response:
    """An error of the table (http.errors) as a response."""
    return Response(error.body(), error.status, media_type="application/json")


def is_loopback_client(request: Request) -> bool:
    """Whether the peer of this connection is a loopback address (127.0.0.0/8, ::1)."""
    if request.client is None:
        return False
    try:
        address = ipaddress.ip_address(request.client.host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


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
        self._routing: dict[str | None, tuple[float, bytes]] = {}  # query -> (at, body)

    def routes(self) -> list[Route]:
        """The routes, for a Starlette app."""
        return [
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/v1/models/{model_id:path}", self.model, methods=["GET"]),
            Route("/v1/chat/completions", self.chat_unrouted, methods=["POST"]),
            # the other APIs over the chat path (chat/dialects), for the 405 of other methods
            *(Route(path, self.chat_unrouted, methods=["POST"]) for path in DIALECTS),
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
        return error_response(503, "this app routes chat requests only behind "
                              "MeshRouteMiddleware", "not_routed")

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
        client = request.client.host if request.client else "unknown"
        if self.node_token:
            given = request.headers.get("authorization", "")
            if hmac.compare_digest(given.encode(), f"Bearer {self.node_token}".encode()):
                return None
            self.mesh.reject("http", f"{client[:64]}: missing or wrong bearer token")
            return error_response(401, f"a valid bearer token is required to {what}",
                                  "invalid_token")
        if is_loopback_client(request):
            return None
        self.mesh.reject("http", f"{client[:64]}: node write from a non-loopback address")
        log.warning("refused a node write from %s: no --node-token is set, so only loopback "
                    "clients may change the mesh", client[:64])
        return error_response(401, f"only loopback clients may {what} on this tracker "
                              "(start it with --node-token to allow others)", "unauthorized")

    async def post_node(self, request: Request) -> Response:
        """Register or refresh a node record."""
        refusal = self._refuse_write(request, "register nodes")
        if refusal is not None:
            return refusal
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
            return error_response(404, f"no node {node_id!r}", "node_not_found")
        return JSONResponse({"removed": node_id})

    async def routing(self, request: Request) -> Response:
        """The learned routing table, optionally for one model."""
        model = request.query_params.get("model")
        if model is not None and model not in self.router.models():
            return error_response(404, f"model {model!r} is not served by any known route",
                                  "model_not_found")
        return Response(self._routing_body(model), media_type="application/json")

    def _routing_body(self, model: str | None) -> bytes:
        """The routing table as JSON, computed at most once per `cache_s` per query."""
        now = self.clock()
        cached = self._routing.get(model)
        if cached is not None and now - cached[0] < self.cache_s:
            return cached[1]
        table = self.router.routing_table(model)
        if self.embeddings_router is not None:
            table["embeddings"] = embeddings_table(self.embeddings_router, model,
                                                   self.embeddings_providers)
        if self.warnings:
            table["config"]["warnings"] = self.warnings
        if self.telemetry.requests is not None:
            table["requests"] = self.telemetry.requests.to_dict()
        table["objectives"] = dict(self.telemetry.objectives)  # requests routed by each
        body = json.dumps(table, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode()
        if len(self._routing) > len(self.router.topology.models()) + 1:  # gone models
            self._routing.clear()
        self._routing[model] = (now, body)
        return body

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
        """Prometheus text exposition: each client's series for a loopback peer or the admin
        token's bearer, their sums without the `client` label for anyone else (issue 32)."""
        return Response(self.telemetry.render_cached(self.clock(), self.cache_s,
                                                     self._sees_clients(request)),
                        media_type=CONTENT_TYPE)

    def _sees_clients(self, request: Request) -> bool:
        """Whether this request may see what each client spent."""
        if is_loopback_client(request):
            return True
        given = request.headers.get("authorization", "")
        return bool(self.admin_token) and hmac.compare_digest(
            given.encode(), f"Bearer {self.admin_token}".encode())

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
        """The OpenAPI document of these endpoints (meshroute_middleware/openapi.py)."""
        return JSONResponse(openapi_document())

    async def health(self, request: Request) -> Response:
        """Liveness: 200 `{"ok": true, ...}`, or 503 with `ok` false and `degraded` naming
        each background service that failed and is waiting to restart (app/supervise.py)."""
        body: dict[str, Any] = {"ok": True, "models": self.router.models(),
                                "tracker": self.router.stats.origin}
        degraded = self.telemetry.services.degraded()
        if not degraded:
            return JSONResponse(body)
        return JSONResponse({**body, "ok": False, "degraded": degraded}, 503)


def script_safe_json(doc: bytes) -> str:
    """JSON text to place inside a <script> element: `<`, `>` and `&` (which occur only in
    its strings) \\u-escaped, so no "</script>" or "<!--" in a value ends the element."""
    return (doc.decode().replace("<", "\\u003c").replace(">", "\\u003e")
            .replace("&", "\\u0026"))


def provider_models(cfg: ProvidersConfig) -> list[dict[str, Any]]:
    """/v1/models entries of the provider tables: chains first, then provider models."""
    chains: list[tuple[str, tuple[str, ...], str]] = []
    active = cfg.profile(cfg.routing.profile) if cfg.routing.profile else None
    auto = active.chain if active is not None else cfg.routing.chain
    if auto:
        chains.append(("auto", auto, (active.strategy if active else None)
                       or cfg.routing.strategy))
    chains += [(f"auto:{p.name}", p.chain, p.strategy or cfg.routing.strategy)
               for p in cfg.profiles]
    data: list[dict[str, Any]] = [
        {"id": name, "object": "model", "owned_by": "meshroute", "kind": "chain",
         "chain": list(chain), "strategy": strategy} for name, chain, strategy in chains]
    data += [{"id": f"{p.name}/{m.id}", "object": "model", "owned_by": p.name,
              "kind": "provider", "tier": m.tier, "context": m.context,
              "capabilities": [c for c in CAPABILITIES if c in m.capabilities]}
             for p in cfg.providers for m in p.models]
    data += [{"id": a.pattern, "object": "model", "owned_by": "meshroute", "kind": "alias",
              "target": a.target, "pattern": a.is_glob} for a in cfg.aliases.entries]
    return data


def routable_model(cfg: ProvidersConfig, model: str) -> dict[str, Any] | None:
    """The model object of a name /v1/models does not list but a request may use: one an
    alias pattern matches, or an `auto:<strategy>`."""
    target = cfg.aliases.resolve(model)
    if target is not None:
        return {"id": model, "object": "model", "owned_by": "meshroute", "kind": "alias",
                "target": target}
    strategy = AUTO_ALIASES.get(model[5:]) if model.startswith("auto:") else None
    if strategy is not None:
        return {"id": model, "object": "model", "owned_by": "meshroute", "kind": "chain",
                "strategy": strategy}
    return None


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
    return answer(INTERNAL_ERROR)


def build_api_app(api: GatewayAPI, extra_routes: list[Route] | None = None) -> Starlette:
    """The inner Starlette app: endpoints plus OpenAI-style error handlers."""
    return Starlette(routes=api.routes() + list(extra_routes or []),
                     exception_handlers={HTTPException: http_error, 500: server_error})


class ProviderRoutingAPI:
    """Provider routes (issue 12): `GET /v1/routing/chain`, `POST /v1/cooldowns/clear`.

    Clearing needs `admin_token` (`--admin-token`, else the node token) whenever one is set,
    else a loopback client; its body is read under the chat body's size limit and timeout.
    """

    def __init__(self, providers: ProviderRouter, router: Router, *,
                 admin_token: str | None = None, clock: Callable[[], float] = time.time,
                 max_body_bytes: int = MAX_NODE_BODY,
                 body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
                 refresh: Callable[[float], Awaitable[None]] | None = None) -> None:
        self.providers, self.router = providers, router
        self.admin_token, self.clock = admin_token, clock
        self.max_body_bytes, self.body_timeout_s = max_body_bytes, body_timeout_s
        self.refresh = refresh  # shared key gates: fetch what other processes learned

    def routes(self) -> list[Route]:
        return [Route("/v1/routing/chain", self.chain, methods=["GET"]),
                Route("/v1/cooldowns/clear", self.clear, methods=["POST"])]

    async def chain(self, request: Request) -> Response:
        """The ordered chain a request for `model` would try now; nothing is sent."""
        model = request.query_params.get("model")
        if not model:
            return error_response(400, "'model' is required: /v1/routing/chain?model=M",
                                  "invalid_model")
        asked = request.query_params.get("objective")
        try:
            res = self.providers.resolve(model, self.router.models())
            objective = (DEFAULT_OBJECTIVE if asked is None
                         else parse_objective(asked, "'objective'"))
        except InvalidModelError as exc:
            return error_response(400, str(exc), "invalid_model")
        except UnknownModelError as exc:
            return error_response(404, str(exc), "model_not_found")
        except InvalidObjectiveError as exc:
            return error_response(400, str(exc), "invalid_objective")
        if self.refresh is not None:
            await self.refresh(self.clock())
        return JSONResponse(self.providers.chain_view(res, self.clock(), objective))

    def _refuse_clear(self, request: Request) -> Response | None:
        """None when this client may clear cooldowns: the admin token when one is set, else
        loopback clients only (as node writes)."""
        if self.admin_token:
            given = request.headers.get("authorization", "")
            if hmac.compare_digest(given.encode(), f"Bearer {self.admin_token}".encode()):
                return None
            return error_response(401, "a valid admin bearer token is required to clear "
                                  "cooldowns", "invalid_token")
        if is_loopback_client(request):
            return None
        client = request.client.host if request.client else "unknown"
        log.warning("refused clearing cooldowns from %r: no --admin-token is set, so only "
                    "loopback clients may", client[:64])
        return error_response(401, "only loopback clients may clear cooldowns on this "
                              "gateway (start it with --admin-token to allow others)",
                              "unauthorized")

    async def clear(self, request: Request) -> Response:
        """Clear cooldowns and 429 penalties: all (an empty body or `{}`), or
        `{"route": ...}`'s; any other body is a 400."""
        refusal = self._refuse_clear(request)
        if refusal is not None:
            return refusal
        try:  # bounded and timed like a chat body (--max-body-bytes, --body-timeout)
            body = await read_body(request.scope, request.receive, self.max_body_bytes,
                                   self.body_timeout_s)
        except RequestError as exc:
            return error_response(exc.status, str(exc), exc.code)
        route: str | None = None
        if body:
            try:
                data = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                return error_response(400, "request body is not valid JSON", "invalid_json")
            if not isinstance(data, dict) or not isinstance(data.get("route", ""), str):
                return error_response(400, "the body is {\"route\": \"provider/model\"}, "
                                      "{} or nothing", "invalid_request")
            route = data.get("route") or None
        if route is not None and not self.providers.knows_route(route):
            return error_response(404, f"no route {route!r}", "route_not_found")
        if self.refresh is not None:
            await self.refresh(self.clock())
        cleared = self.providers.clear(route, self.clock())  # the time: gossip's clears
        return JSONResponse({"cleared": cleared, "route": route})


class UsageAPI:
    """`GET /v1/usage?client=NAME&since=UNIX&group_by=client|route|day` (issue 24): the usage
    ledger summed by client, route or UTC day (or a comma list of them), from the UTC day of
    `since` on. The admin token (`--admin-token`; without one, a loopback client) sees every
    client; a client's own key (`Authorization: Bearer` or `x-api-key`) sees its own rows
    only, and naming another client is a 403."""

    def __init__(self, spend: ClientSpend | None, clients: Sequence[Client] = (), *,
                 admin_token: str | None = None) -> None:
        self.spend, self.admin_token = spend, admin_token
        self.clients = tuple(clients)

    def routes(self) -> list[Route]:
        return [Route("/v1/usage", self.usage, methods=["GET"])]

    async def usage(self, request: Request) -> Response:
        """The ledger's rows for whom the caller may see."""
        who = self._caller(request)
        if isinstance(who, Response):
            return who
        query = request.query_params
        client = query.get("client") or None
        if who is not None:
            if client is not None and client != who.name:
                return error_response(403, "a client's key sees its own usage only",
                                      "forbidden")
            client = who.name
        try:
            since = float(query.get("since", "0"))  # given empty (`since=`): refused
        except ValueError:
            since = math.nan
        if not (math.isfinite(since) and since >= 0):
            return error_response(400, "'since' must be UNIX seconds (a number >= 0)",
                                  "invalid_since")
        groups = tuple((query.get("group_by") or "client").split(","))
        if not groups or any(g not in GROUPS for g in groups) or len(set(groups)) < len(groups):
            return error_response(400, "'group_by' is client, route or day (or a comma list "
                                  "of them)", "invalid_group_by")
        try:
            rows = [] if self.spend is None else await self.spend.usage_rows(client, since)
        except LimitsStoreDown as exc:
            return error_response(503, f"the usage ledger is not available: {exc}",
                                  "limits_store_unavailable")
        data = usage_report(rows, groups, client=client, since=since)
        for row in data:
            if "day" in row:
                row["date"] = time.strftime("%Y-%m-%d", time.gmtime(row["day"] * 86400))
        return JSONResponse({"object": "list", "group_by": ",".join(groups), "since": since,
                             "client": client, "data": data})

    def _caller(self, request: Request) -> Client | Response | None:
        """The client whose key this is; None for the admin; else the 401 to answer."""
        keys = presented_keys(request.scope.get("headers", ()))  # the chat path's one reader
        if not keys:
            if not self.admin_token and is_loopback_client(request):
                return None
            return error_response(401, "/v1/usage needs the admin token or a client's key "
                                  "(Authorization: Bearer KEY or x-api-key)", "missing_api_key")
        given = keys[0]
        if self.admin_token and hmac.compare_digest(given, self.admin_token.encode()):
            return None
        found = find_client(self.clients, given)  # every digest compared, in constant time
        if found is not None:
            return found
        return error_response(401, "the key is neither the admin token nor a client's",
                              "invalid_api_key")


def embeddings_table(router: Router, model: str | None,
                     providers: ProviderRouter | None = None) -> dict[str, Any]:
    """The embeddings statistics of the models with embeddings traffic, over their routes
    that declare `embeddings`: `tps` there is inputs per second (also as `inputs_per_s`),
    `ttfb_ms` the whole answer's latency (also as `latency_ms`: it comes in one piece)."""
    out: dict[str, Any] = {}
    # only the models embeddings were sent to: a table per model costs (shares are sampled)
    measured = {key[0] for key, _ in router.stats} if model is None else {model}
    for name in sorted(m for m in measured if router.topology.model(m) is not None):
        entry = router.routing_table(name)["models"][name]
        capable = {r.signature for r in router.candidates(name, NEEDS["embeddings"])}
        rows = [r for r in entry["candidates"] if r["signature"] in capable]
        if not any(r["successes"] or r["failures"] or r["in_flight"] for r in rows):
            continue  # no embeddings traffic: chat's table says all there is
        total = sum(r["share"] for r in rows)
        for row in rows:
            row["inputs_per_s"], row["latency_ms"] = row["tps"], row["ttfb_ms"]
            row["share"] = row["share"] / total if total > 0 else 0.0
        out[name] = {**entry, "candidates": rows}
    table: dict[str, Any] = {"unit": "inputs_per_s", "models": out}
    if providers is not None and model is None:  # provider routes: by route, as measured
        table["providers"] = {
            route: {"inputs_per_s": st.tokens_per_s, "latency_ms": st.ttfb_ms,
                    "successes": st.ok, "failures": st.fail}
            for route, st in sorted(providers.stats.items())}
    return table
