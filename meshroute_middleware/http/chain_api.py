"""The provider chain's endpoints (issue 12): `GET /v1/routing/chain` (the chain a request
would try now) and `POST /v1/cooldowns/clear`."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from meshroute_middleware.core import Router, UnknownModelError
from meshroute_middleware.core.objectives import (
    DEFAULT_OBJECTIVE,
    InvalidObjectiveError,
    parse_objective,
)
from meshroute_middleware.core.providers.chain import InvalidModelError
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.http.access import has_bearer, is_loopback_client, peer_of
from meshroute_middleware.http.errors import ErrorAnswer, HttpError, answer
from meshroute_middleware.http.gateway_api import MAX_NODE_BODY
from meshroute_middleware.http.request import DEFAULT_BODY_TIMEOUT_S, RequestError, read_body

__all__ = ["ProviderRoutingAPI"]

log = logging.getLogger("meshroute.api")


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
            return HttpError.INVALID_MODEL.response(
                "'model' is required: /v1/routing/chain?model=M")
        asked = request.query_params.get("objective")
        try:
            res = self.providers.resolve(model, self.router.models())
            objective = (DEFAULT_OBJECTIVE if asked is None
                         else parse_objective(asked, "'objective'"))
        except InvalidModelError as exc:
            return HttpError.INVALID_MODEL.response(str(exc))
        except UnknownModelError as exc:
            return HttpError.MODEL_NOT_FOUND.response(str(exc))
        except InvalidObjectiveError as exc:
            return HttpError.INVALID_OBJECTIVE.response(str(exc))
        if self.refresh is not None:
            await self.refresh(self.clock())
        return JSONResponse(self.providers.chain_view(res, self.clock(), objective))

    def _refuse_clear(self, request: Request) -> Response | None:
        """None when this client may clear cooldowns: the admin token when one is set, else
        loopback clients only (as node writes)."""
        if self.admin_token:
            if has_bearer(request, self.admin_token):
                return None
            return HttpError.INVALID_TOKEN.response(
                "a valid admin bearer token is required to clear "
                "cooldowns")
        if is_loopback_client(request):
            return None
        log.warning("refused clearing cooldowns from %r: no --admin-token is set, so only "
                    "loopback clients may", peer_of(request))
        return HttpError.UNAUTHORIZED.response(
            "only loopback clients may clear cooldowns on this "
            "gateway (start it with --admin-token to allow others)")

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
            return answer(ErrorAnswer.of(exc))
        route: str | None = None
        if body:
            try:
                data = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                return HttpError.INVALID_JSON.response("request body is not valid JSON")
            if not isinstance(data, dict) or not isinstance(data.get("route", ""), str):
                return HttpError.INVALID_REQUEST.response(
                    "the body is {\"route\": \"provider/model\"}, "
                    "{} or nothing")
            route = data.get("route") or None
        if route is not None and not self.providers.knows_route(route):
            return HttpError.ROUTE_NOT_FOUND.response(f"no route {route!r}")
        if self.refresh is not None:
            await self.refresh(self.clock())
        cleared = self.providers.clear(route, self.clock())  # the time: gossip's clears
        return JSONResponse({"cleared": cleared, "route": route})
