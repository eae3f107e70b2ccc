"""Errors as OpenAI-style JSON answers: one table maps each error type to its HTTP status and
code (the OpenAI `type` follows from the status), and every path answers through it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Send

from meshroute_middleware.core.capabilities import UnsupportedCapabilityError
from meshroute_middleware.core.clients import (
    InvalidKeyError,
    MissingKeyError,
    ModelNotAllowedError,
)
from meshroute_middleware.core.contracts.error_body import ERROR_TYPES, error_body, error_type
from meshroute_middleware.core.errors import (
    InvalidNodeError,
    InvalidPinError,
    MeshRouteError,
    NoRouteError,
    UnknownModelError,
)
from meshroute_middleware.core.providers.chain import InvalidModelError
from meshroute_middleware.core.providers.exhaustion import Exhaustion, PassedOver
from meshroute_middleware.mesh import MeshFullError

__all__ = ["ERROR_TYPES", "INTERNAL_ERROR", "DeadlineExceeded", "ErrorAnswer", "RequestError",
           "RoutesFailed", "RoutesRateLimited", "RoutesTooSmall", "UpstreamFailed", "error_body",
           "exhaustion_answer", "send_error"]

INTERNAL_MESSAGE = "internal error in meshroute; see the server log"


class RequestError(MeshRouteError):
    """A client error with its HTTP status and OpenAI error code (and `param`, the request
    field it is about, when it is about one)."""

    def __init__(self, status: int, message: str, code: str,
                 headers: Iterable[tuple[bytes, bytes]] = (), param: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.param = status, code, param
        self.headers = list(headers)  # sent with the error (a 429's Retry-After)


class RoutesFailed(NoRouteError):
    """No route answered; `routes` says why, route by route, in order (every path's shape)."""

    def __init__(self, message: str, routes: Sequence[PassedOver] = ()) -> None:
        super().__init__(message, {p.route: p.reason for p in routes})
        self.routes = tuple(routes)


class RoutesRateLimited(RoutesFailed):
    """A route was passed over for a rate limit: the client should come back later."""


class UpstreamFailed(RoutesFailed):
    """The routes were tried and failed upstream (5xx, connect, timeout, a broken stream)."""


class DeadlineExceeded(RoutesFailed):
    """The request's deadline ran out before any route answered."""


class RoutesTooSmall(RoutesFailed):
    """The request is larger than the context of every route of its model."""


# The one table: error type -> (HTTP status, OpenAI error code); the most specific type wins
# (looked up along the exception's MRO). RequestError carries its own status and code.
ERROR_TABLE: dict[type[BaseException], tuple[int, str]] = {
    InvalidNodeError: (400, "invalid_node"),
    MeshFullError: (409, "too_many_nodes"),
    InvalidModelError: (400, "invalid_model"),
    InvalidPinError: (400, "invalid_route"),
    UnsupportedCapabilityError: (400, "unsupported_capability"),
    UnknownModelError: (404, "model_not_found"),
    NoRouteError: (503, "no_route_available"),
    RoutesFailed: (503, "no_route_available"),
    RoutesRateLimited: (429, "rate_limited"),
    UpstreamFailed: (502, "upstream_failed"),
    DeadlineExceeded: (504, "request_timeout"),
    RoutesTooSmall: (413, "context_length_exceeded"),
    MissingKeyError: (401, "missing_api_key"),  # [[clients]] (issue 24)
    InvalidKeyError: (401, "invalid_api_key"),
    ModelNotAllowedError: (403, "model_not_allowed"),
}


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """An error as the client gets it: status, message, code and any extra fields."""

    status: int
    message: str
    code: str
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, exc: BaseException, message: str | None = None) -> ErrorAnswer:
        """The answer for `exc` from the table (a 500 for anything not in it)."""
        text = str(exc) if message is None else message
        if isinstance(exc, RequestError):
            return cls(exc.status, text, exc.code,
                       {} if exc.param is None else {"param": exc.param})
        for kind in type(exc).__mro__:
            entry = ERROR_TABLE.get(kind)
            if entry is not None:
                extra = {"routes": routes_field(exc)} if isinstance(exc, NoRouteError) else {}
                return cls(entry[0], text, entry[1], extra)
        return INTERNAL_ERROR

    @property
    def type(self) -> str:
        """The OpenAI error `type` of this answer."""
        return error_type(self.status)

    def body(self) -> bytes:
        return error_body(self.status, self.message, self.code, **self.extra)

    async def send(self, send: Send, headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
        """Send it as a complete response."""
        await send_error(send, self.status, self.message, self.code, headers, **self.extra)


INTERNAL_ERROR = ErrorAnswer(500, INTERNAL_MESSAGE, "internal_error")  # a bug of ours
# The error of each status of the exhaustion rule (core/providers/exhaustion.py)
_EXHAUSTED: dict[int, type[RoutesFailed]] = {413: RoutesTooSmall, 429: RoutesRateLimited,
                                             502: UpstreamFailed, 503: RoutesFailed}


def exhaustion_answer(exhausted: Exhaustion) -> ErrorAnswer:
    """The one answer to a request no route answered, on every path (mesh, chain, mitm)."""
    return ErrorAnswer.of(_EXHAUSTED[exhausted.status](exhausted.message, exhausted.routes))


def routes_field(exc: NoRouteError) -> list[dict[str, Any]]:
    """The error's `routes`: `[{"route", "reason", "until"}]`, route by route."""
    if isinstance(exc, RoutesFailed):
        return [p.to_dict() for p in exc.routes]
    return [{"route": r, "reason": why, "until": None} for r, why in exc.reasons.items()]


async def send_error(send: Send, status: int, message: str, code: str,
                     headers: Iterable[tuple[bytes, bytes]] = (), **extra: Any) -> None:
    """Send a complete OpenAI-style error response."""
    body = error_body(status, message, code, **extra)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})
