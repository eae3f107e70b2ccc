"""Errors as OpenAI-style JSON answers: one table (`HttpError`) holds every client-visible
error's HTTP status and code (the OpenAI `type` follows from the status), exception types map
to its kinds (`ERROR_TABLE`), and every path answers through it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
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

__all__ = ["ERROR_TABLE", "ERROR_TYPES", "INTERNAL_ERROR", "DeadlineExceeded", "ErrorAnswer",
           "HttpError", "RequestError", "RoutesFailed", "RoutesRateLimited", "RoutesTooSmall",
           "UpstreamFailed", "answer", "error_body", "error_response", "exhaustion_answer",
           "http_error", "routes_field", "send_error", "server_error"]

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


class HttpError(Enum):
    """The one table of client-visible errors: each kind's HTTP status and OpenAI error code
    (the OpenAI `type` follows from the status). Every error answer names its kind here; no
    status is written anywhere else (tests/http/test_error_literals.py)."""

    # 400: the request is not one we can serve
    INVALID_JSON = (400, "invalid_json")
    INVALID_REQUEST = (400, "invalid_request")
    INVALID_MODEL = (400, "invalid_model")
    INVALID_OBJECTIVE = (400, "invalid_objective")
    INVALID_ROUTE = (400, "invalid_route")
    INVALID_SESSION_ID = (400, "invalid_session_id")
    INVALID_NODE = (400, "invalid_node")
    INVALID_SINCE = (400, "invalid_since")
    INVALID_GROUP_BY = (400, "invalid_group_by")
    INVALID_INPUT = (400, "invalid_input")
    INVALID_DIMENSIONS = (400, "invalid_dimensions")
    INVALID_ENCODING_FORMAT = (400, "invalid_encoding_format")
    INVALID_PROMPT = (400, "invalid_prompt")
    INVALID_MAX_TOKENS = (400, "invalid_max_tokens")
    INVALID_STREAM = (400, "invalid_stream")
    UNSUPPORTED_CAPABILITY = (400, "unsupported_capability")
    # 401, 403: who asks
    MISSING_API_KEY = (401, "missing_api_key")
    INVALID_API_KEY = (401, "invalid_api_key")
    INVALID_TOKEN = (401, "invalid_token")
    UNAUTHORIZED = (401, "unauthorized")
    FORBIDDEN = (403, "forbidden")
    MODEL_NOT_ALLOWED = (403, "model_not_allowed")
    ORIGIN_NOT_ALLOWED = (403, "origin_not_allowed")
    INVALID_CONTENT_TYPE = (403, "invalid_content_type")
    # 404, 405: what is asked for
    NOT_FOUND = (404, "not_found")
    MODEL_NOT_FOUND = (404, "model_not_found")
    NODE_NOT_FOUND = (404, "node_not_found")
    ROUTE_NOT_FOUND = (404, "route_not_found")
    INVALID_TICKET = (404, "invalid_ticket")
    METHOD_NOT_ALLOWED = (405, "method_not_allowed")
    # 408-499: how it is asked
    REQUEST_TIMEOUT = (408, "request_timeout")
    TOO_MANY_NODES = (409, "too_many_nodes")
    REQUEST_TOO_LARGE = (413, "request_too_large")
    CONTEXT_LENGTH_EXCEEDED = (413, "context_length_exceeded")  # larger than every route
    TOO_MANY_VALUES = (413, "too_many_values")
    TOO_MANY_MESSAGES = (413, "too_many_messages")
    TOO_MANY_CONTENT_PARTS = (413, "too_many_content_parts")
    INVALID_HOST = (421, "invalid_host")
    RATE_LIMITED = (429, "rate_limited")
    CLIENT_RATE_LIMITED = (429, "client_rate_limited")
    BUDGET_EXCEEDED = (429, "budget_exceeded")
    HEADERS_TOO_LARGE = (431, "headers_too_large")
    CLIENT_CLOSED = (499, "client_closed")  # nginx's: the client left before its answer
    # 5xx: ours or the routes'
    INTERNAL = (500, "internal_error")
    UPSTREAM_FAILED = (502, "upstream_failed")
    UPSTREAM_ANSWER_INVALID = (502, "invalid_upstream_answer")
    NO_ROUTE = (503, "no_route_available")
    NOT_ROUTED = (503, "not_routed")
    SHUTTING_DOWN = (503, "shutting_down")
    TOO_MANY_CONNECTIONS = (503, "too_many_connections")
    LIMITS_STORE_UNAVAILABLE = (503, "limits_store_unavailable")
    DEGRADED = (503, "degraded")  # /healthz while a background service waits to restart
    DEADLINE = (504, "request_timeout")
    LOOP_DETECTED = (508, "loop_detected")

    def __init__(self, status: int, code: str) -> None:
        self.status, self.code = status, code

    def error(self, message: str, headers: Iterable[tuple[bytes, bytes]] = (),
              param: str | None = None) -> RequestError:
        """This error as an exception, to raise."""
        return RequestError(self.status, message, self.code, headers, param)

    def answer(self, message: str, **extra: Any) -> ErrorAnswer:
        """This error as the client gets it."""
        return ErrorAnswer(self.status, message, self.code, extra)

    def response(self, message: str, headers: dict[str, str] | None = None,
                 **extra: Any) -> Response:
        """This error as a Starlette response."""
        return error_response(self.status, message, self.code, headers, **extra)

    async def send(self, send: Send, message: str,
                   headers: Iterable[tuple[bytes, bytes]] = (), **extra: Any) -> None:
        """Send this error as a complete response."""
        await send_error(send, self.status, message, self.code, headers, **extra)


# Error types -> their kind; the most specific type wins (looked up along the exception's
# MRO). RequestError carries its own status and code (a kind's `error()` makes one).
ERROR_TABLE: dict[type[BaseException], HttpError] = {
    InvalidNodeError: HttpError.INVALID_NODE,
    MeshFullError: HttpError.TOO_MANY_NODES,
    InvalidModelError: HttpError.INVALID_MODEL,
    InvalidPinError: HttpError.INVALID_ROUTE,
    UnsupportedCapabilityError: HttpError.UNSUPPORTED_CAPABILITY,
    UnknownModelError: HttpError.MODEL_NOT_FOUND,
    NoRouteError: HttpError.NO_ROUTE,
    RoutesFailed: HttpError.NO_ROUTE,
    RoutesRateLimited: HttpError.RATE_LIMITED,
    UpstreamFailed: HttpError.UPSTREAM_FAILED,
    DeadlineExceeded: HttpError.DEADLINE,
    RoutesTooSmall: HttpError.CONTEXT_LENGTH_EXCEEDED,
    MissingKeyError: HttpError.MISSING_API_KEY,  # [[clients]] (issue 24)
    InvalidKeyError: HttpError.INVALID_API_KEY,
    ModelNotAllowedError: HttpError.MODEL_NOT_ALLOWED,
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
                return cls(entry.status, text, entry.code, extra)
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


INTERNAL_ERROR = HttpError.INTERNAL.answer(INTERNAL_MESSAGE)  # a bug of ours
SHUTTING_DOWN_MESSAGE = "the gateway is shutting down"  # a request a stopping gateway ends
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


def error_response(status: int, message: str, code: str, headers: dict[str, str] | None = None,
                   **extra: Any) -> Response:
    """An OpenAI-style JSON error response."""
    return Response(error_body(status, message, code, **extra), status, headers=headers,
                    media_type="application/json")


def answer(error: ErrorAnswer) -> Response:
    """An error of the table as a response."""
    return Response(error.body(), error.status, media_type="application/json")


async def http_error(request: Request, exc: Exception) -> Response:
    """Starlette's HTTP errors (404, 405, ...) as OpenAI-style JSON."""
    status = exc.status_code if isinstance(exc, HTTPException) else HttpError.INTERNAL.status
    if status == HttpError.NOT_FOUND.status:
        return HttpError.NOT_FOUND.response(
            f"no such endpoint: {request.method} {request.url.path}")
    if status == HttpError.METHOD_NOT_ALLOWED.status:
        return HttpError.METHOD_NOT_ALLOWED.response(
            f"method {request.method} not allowed on {request.url.path}",
            headers=getattr(exc, "headers", None))  # Allow (RFC 9110)
    detail = exc.detail if isinstance(exc, HTTPException) else "internal error"
    return error_response(status, str(detail), "http_error")


async def server_error(request: Request, exc: Exception) -> Response:
    """Any unexpected exception: logged by the server, a JSON 500 for the client."""
    return answer(INTERNAL_ERROR)
