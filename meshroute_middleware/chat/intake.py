"""A routed request's intake: its body read into a `ChatRequest`, and the answer to a request
refused before it is served (each error mapped by `http/errors.py`'s table)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from meshroute_middleware.chat.dialects import Translation
from meshroute_middleware.chat.spend import ClientSpend
from meshroute_middleware.core import InvalidPinError, NoRouteError, UnknownModelError
from meshroute_middleware.core.capabilities import UnsupportedCapabilityError
from meshroute_middleware.core.clients import Client, ModelNotAllowedError
from meshroute_middleware.core.errors import ModelGoneError
from meshroute_middleware.http.errors import INTERNAL_ERROR, ErrorAnswer, RequestError
from meshroute_middleware.http.inference import PARSERS
from meshroute_middleware.http.request import (
    ChatRequest,
    RequestKind,
    check_large,
    parse_chat,
    replay,
)
from meshroute_middleware.http.shape import BodyLimits
from meshroute_middleware.telemetry.metrics import Telemetry

if TYPE_CHECKING:
    from meshroute_middleware.chat.providers import ProviderChat

log = logging.getLogger("meshroute.middleware")


def parse(body: bytes, translation: Translation | None, kind: RequestKind,
          objective: bytes | None, session_id: str | None,
          count_tokens: bool = True) -> ChatRequest:
    """The request a body holds, in its API's translation (RequestError when invalid).
    `count_tokens`: a chat request keeps its token estimate (a limited client's admission
    reads it; otherwise it is not counted)."""
    if translation is not None:
        body = translation.request(body)
    if kind == "chat":
        return parse_chat(body, objective, session_id, count_tokens)
    return PARSERS[kind](body, objective, session_id)


def _parse_large(body: bytes, limits: BodyLimits, translation: Translation | None,
                 kind: RequestKind, objective: bytes | None,
                 session_id: str | None, count_tokens: bool) -> ChatRequest:
    check_large(body, limits)
    return parse(body, translation, kind, objective, session_id, count_tokens)


async def parse_large(body: bytes, limits: BodyLimits, translation: Translation | None,
                      kind: RequestKind, objective: bytes | None, session_id: str | None,
                      spend: ClientSpend | None, client: Client | None) -> ChatRequest:
    """`parse` for a body over the inline size: a client over its rpm is refused first, then
    the body's shape is judged within `limits` and read, in a worker thread (off the loop)."""
    if spend is not None and client is not None:
        await spend.check(client)
    # estimated here for any client (off the loop), not later on it (`Metered.close`)
    return await asyncio.to_thread(_parse_large, body, limits, translation, kind, objective,
                                   session_id, spend is not None and client is not None)


class Host(Protocol):
    """What a refusal needs of the middleware that took the request."""

    app: ASGIApp
    annotate: bool
    telemetry: Telemetry
    providers: ProviderChat | None


def unknown_model(exc: UnknownModelError, model: str,
                  providers: ProviderChat | None) -> ErrorAnswer:
    """A model no node serves: 503 when it is known (its last node left, or it has a
    `[mesh.MODEL]` table), else 404."""
    if isinstance(exc, ModelGoneError):
        return ErrorAnswer.of(exc)
    if providers is not None and model in providers.providers.cfg.mesh_limits:
        return ErrorAnswer.of(ModelGoneError(
            f"no node serves model {model!r} now: it is a declared mesh model "
            f"([mesh.{model}]), routed as soon as a node serves it"))
    return ErrorAnswer.of(exc, f"model {model!r} is not served by any known route")


async def refuse(host: Host, exc: Exception, scope: Scope, receive: Receive, send: Send,
                 req: ChatRequest | None, kind: RequestKind) -> None:
    """Answer a request refused before it was served; in annotate mode, a model or a
    capability no node has (unpinned) is the app's to serve instead."""
    if isinstance(exc, RequestError):
        if exc.status != 499:  # 499: the client left while sending; nobody to answer
            if exc.status in (408, 413, 508) or exc.code in ("invalid_json",
                                                              "invalid_session_id"):
                host.telemetry.reject("http", f"{exc.status} {exc.code}: {exc}")
                log.warning("meshroute: refused a chat request: %s %s", exc.status, exc)
            await ErrorAnswer.of(exc).send(send, exc.headers)
    elif req is not None and isinstance(exc, UnknownModelError | UnsupportedCapabilityError):
        app_serves = isinstance(exc, UnknownModelError) or kind != "chat"
        if host.annotate and req.pin is None and app_serves:  # the app may serve it itself
            await host.app(scope, replay(req.body, receive), send)
        elif isinstance(exc, UnknownModelError):
            await unknown_model(exc, req.model, host.providers).send(send)
        else:
            await ErrorAnswer.of(exc).send(send)
    elif isinstance(exc, InvalidPinError | NoRouteError | ModelNotAllowedError):
        await ErrorAnswer.of(exc).send(send)
    else:  # a bug of ours while choosing: a JSON error, never a traceback
        log.error("meshroute: internal error while choosing a route", exc_info=exc)
        await INTERNAL_ERROR.send(send)
