"""MeshRouteMiddleware: pure ASGI; picks a route for each chat request and measures it.

forward:  the request goes to the chosen route's head; the response streams back untouched.
annotate: the wrapped app serves the request itself, told the plan in headers and in
          scope["state"]["meshroute"]; the middleware measures the app's response.
Either way failures before the first byte fall back down the ranked routes, and every
response carries x-meshroute-route and x-meshroute-mode.

This module is the ASGI dispatch only: the options (`chat/config.py`), the intake and the
answers to refused requests (`chat/intake.py`), the modes, the attempt lifecycle, the watchdog
and the headers live in `meshroute_middleware.chat`.
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from meshroute_middleware.chat.aliasing import answer_model, with_model
from meshroute_middleware.chat.annotate import AnnotateMode
from meshroute_middleware.chat.attempts import Attempts, Exchange, internal_error
from meshroute_middleware.chat.body_deadline import BodyDeadlines
from meshroute_middleware.chat.config import (
    DEFAULT_MAX_BODY_BYTES,
    MiddlewareConfig,
    build_embeddings_router,
    build_router,
)
from meshroute_middleware.chat.dialects import DIALECTS, Local, Translation
from meshroute_middleware.chat.forward import ForwardMode
from meshroute_middleware.chat.headers import VIA, add_via, allow_list, came_back, via_entry
from meshroute_middleware.chat.hedge import Hedging
from meshroute_middleware.chat.intake import parse, parse_large, refuse
from meshroute_middleware.chat.keyring import NodeSecrets
from meshroute_middleware.chat.spend import ClientSpend, Metered
from meshroute_middleware.chat.stream_usage import UsageStrip, with_usage
from meshroute_middleware.core import Router
from meshroute_middleware.core.aliases import NO_ALIASES, Aliases
from meshroute_middleware.core.clients import (
    InvalidKeyError,
    MissingKeyError,
    check_model,
    check_pin,
)
from meshroute_middleware.forwarding.client import AiohttpForwarder, Forwarder
from meshroute_middleware.http.auth import CHALLENGE, ClientAuth, client_of
from meshroute_middleware.http.errors import ErrorAnswer, HttpError
from meshroute_middleware.http.request import (
    H_OBJECTIVE,
    PATHS,
    ChatRequest,
    RequestKind,
    check_session_id,
    header_value,
    read_body,
)
from meshroute_middleware.telemetry.metrics import Telemetry
from meshroute_middleware.telemetry.requests import RequestTally, Watch

if TYPE_CHECKING:
    from meshroute_middleware.chat.providers import ProviderChat

__all__ = ["DEFAULT_MAX_BODY_BYTES", "MeshRouteMiddleware", "MiddlewareConfig",
           "build_embeddings_router", "build_router"]

log = logging.getLogger("meshroute.middleware")


class MeshRouteMiddleware:
    """Pure ASGI middleware in front of any chat server (starlette style).

    Without a `router`, it routes with a `build_router()` of its own (`.router`, to add
    nodes to); without a `forwarder`, it forwards with an `AiohttpForwarder()`. Embeddings
    are routed by `embeddings_router` (default: `build_embeddings_router(router)`), chat and
    completions by `router`.
    """

    def __init__(self, app: ASGIApp, config: MiddlewareConfig | None = None, *,
                 router: Router | None = None, forwarder: Forwarder | None = None,
                 telemetry: Telemetry | None = None,
                 providers: ProviderChat | None = None,
                 spend: ClientSpend | None = None,
                 aliases: Aliases = NO_ALIASES,
                 node_keys: NodeSecrets | None = None,
                 embeddings_router: Router | None = None,
                 hedging: Hedging | None = None) -> None:
        self.app = app
        self.aliases = aliases  # `[aliases]`: applied to the requested model before routing
        self.providers = providers  # provider routes (issue 12): auto, auto:*, provider/model
        self.spend = spend  # clients' limits, budgets and usage ledger (issue 24)
        self.config = config or MiddlewareConfig()
        self.router = router or build_router()
        self.embeddings_router = embeddings_router or build_embeddings_router(self.router)
        # the routed endpoints, by path: one branch of __call__ serves them all (and the
        # dialects' paths), so what guards one guards every one
        self._kinds: dict[str, RequestKind] = {
            **{p: k for k, p in PATHS.items() if k != "chat"}, self.config.path: "chat"}
        self.forwarder = forwarder or AiohttpForwarder()
        self.telemetry = telemetry or Telemetry(self.router)
        if self.telemetry.requests is None:
            self.telemetry.requests = RequestTally()
        self._requests = self.telemetry.requests  # what /v1/routing and the dashboard count
        self.annotate = self.config.mode == "annotate"
        self._via = via_entry(self.config.loop_marker or secrets.token_hex(8))
        self._via_header = (VIA, self._via)
        self._auth = ClientAuth(self.config.clients)
        self._bodies = BodyDeadlines(self.config.body_timeout_s)
        self._mode: AnnotateMode | ForwardMode = (
            AnnotateMode(app) if self.annotate else ForwardMode(
                self.forwarder, forward_headers=allow_list(self.config.forward_headers),
                node_keys=node_keys, hedging=hedging, spend=spend))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            lifespan = scope["type"] == "lifespan"
            await self.app(scope, receive, self._lifespan_send(send) if lifespan else send)
            return
        path = scope["path"]
        kind = self._kinds.get(path)
        dialect = DIALECTS.get(path) if kind is None else None
        if scope["method"] != "POST":  # the app answers (a dialect's 405 in its error shape)
            await self.app(scope, receive, send if dialect is None else dialect.open(send).send)
        elif kind is None and dialect is None:
            await self.app(scope, receive, send)
        else:
            translation = None if dialect is None else dialect.open(send)
            # counts the request by the chat path's answer (before any translation: one
            # rule for what an answered request is, whatever API it is answered in)
            watched = Watch(self._requests, send if translation is None else translation.send)
            try:
                refused = self._unauthenticated(scope)  # every inference path, first
                if refused is None:
                    await self._chat(scope, receive, watched, translation, kind or "chat",
                                     watched)
                else:
                    await refused.send(watched, CHALLENGE)
            finally:
                watched.close()

    def _unauthenticated(self, scope: Scope) -> ErrorAnswer | None:
        """None when the request may go on: its client known (or none configured), its key
        out of its headers; else its 401 (counted and logged). Before any body is read."""
        try:
            client = self._auth.authenticate(scope)
        except (MissingKeyError, InvalidKeyError) as exc:
            answer = ErrorAnswer.of(exc)
            self.telemetry.reject("http", f"401 {answer.code}", answer.code)
            self._auth.log_refusal(scope["path"], answer.code)
            return answer
        if client is not None:
            log.debug("client %s: %s", client.name, scope["path"])
        return None

    def _lifespan_send(self, send: Send) -> Send:
        async def _send(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete":
                await self.forwarder.aclose()
            await send(message)
        return _send

    def router_for(self, kind: RequestKind) -> Router:
        """The Router whose statistics a kind of request reads and writes."""
        return self.embeddings_router if kind == "embeddings" else self.router

    async def _chat(self, scope: Scope, receive: Receive, send: Send,
                    translation: Translation | None = None, kind: RequestKind = "chat",
                    watch: Watch | None = None) -> None:
        metered: Metered | None = None
        req: ChatRequest | None = None
        try:
            if came_back(scope, self._via):
                raise HttpError.LOOP_DETECTED.error(
                    "this request already passed through this gateway: "
                    "a node URL leads back to it (a forwarding loop)")
            session_id = check_session_id(scope)
            add_via(scope, self._via_header)
            client = client_of(scope)
            if (translation is not None and client is not None and self.spend is not None
                    and isinstance(translation, Local)):  # count_tokens: under the client's rpm
                await self.spend.admit_free(client)
            with self._bodies:  # its deadline (408): one timer for every body being read
                body = await read_body(scope, receive, self.config.max_body_bytes)
            objective = header_value(scope, H_OBJECTIVE)
            if self.config.body_limits.inline(body):  # small: read at once
                req = parse(body, translation, kind, objective, session_id,
                            client is not None and client.limited and self.spend is not None)
            else:  # judged and read off the loop
                req = await parse_large(body, self.config.body_limits, translation, kind,
                                        objective, session_id, self.spend, client)
            target = self.aliases.resolve(req.model) if self.aliases else None
            if target is not None:  # the answer names the model the client asked for
                req, send = with_model(req, target), answer_model(send, req.model)
            req.client = client
            # the allow-list by the name asked for (after `[aliases]`): a mesh model,
            # `provider/model` or a chain (`auto`, `auto:coding`), before the request spends
            # anything (issue 24)
            check_model(client, req.model)
            chain = self.providers is not None and self.providers.claims(req.model)
            if chain and req.pin is not None:  # a chain's pin names a route: the same rule
                check_pin(client, req.pin)
            req.translation = translation
            if translation is not None and isinstance(translation, Local):  # answered by the
                # dialect, routed nowhere (a runtime Protocol check costs µs: only for dialects)
                if watch is not None:
                    watch.forget()  # not a routed request: the request counts leave it out
                await translation.answer()
                return
            if req.stream and not req.asks_usage and kind == "chat":
                # every upstream reports a stream's usage; the client gets what it asked for
                req.body, send = with_usage(req.body), UsageStrip(send)
            if self.spend is not None and client is not None:
                # a client's request: admitted (or a 429), then metered
                send = metered = await self.spend.admit(client, req, send, chain)
            if translation is not None:  # an app that serves it (annotate) gets a chat request
                scope = {**scope, "path": self.config.path,
                         "raw_path": self.config.path.encode()}
            router = self.embeddings_router if kind == "embeddings" else self.router
            decision = None if chain else router.choose(req.model, req.pin, req.max_tokens,
                                                        req.prefix, req.needs,
                                                        objective=req.objective)
            self.telemetry.asked(req.objective)
        except Exception as exc:  # each answered in its API's shape, never a traceback
            await refuse(self, exc, scope, receive, send, req, kind)
            return
        # served here, not in a coroutine of its own: one object less per open stream
        try:
            if decision is None:
                assert self.providers is not None
                await self.providers.serve(scope, receive, send, req)
                return
            attempts = Attempts(router, self.telemetry, req.model, req.max_tokens,
                                self.config.request_timeout_s, kind=kind, inputs=req.inputs)
            if self.providers is not None:  # with provider routes, every answer says what
                send = self.providers.with_tried(send, attempts)  # it tried
            ex = Exchange(scope, receive, send, req, attempts)
            self.telemetry.in_flight += 1
            try:
                await self._mode.serve(ex, decision)
            except Exception:  # a bug of ours: no traceback, no hung request for the client
                if not await internal_error(ex, "routing a chat request"):
                    raise
            finally:
                self.telemetry.in_flight -= 1
                attempts.close()
        finally:
            if metered is not None:  # recorded once, however its answer ended
                await metered.close()
