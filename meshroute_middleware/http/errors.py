"""Errors as OpenAI-style JSON answers: one table maps each error type to its HTTP status and
code (the OpenAI `type` follows from the status), and every path answers through it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
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
from meshroute_middleware.core.providers.exhaustion import UPSTREAM_FAILED
from meshroute_middleware.mesh import MeshFullError

__all__ = ["ERROR_TYPES", "INTERNAL_ERROR", "DeadlineExceeded", "ErrorAnswer", "RequestError",
           "RoutesFailed", "RoutesRateLimited", "UpstreamFailed", "error_body", "send_error"]

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
    """Every route tried failed before its first byte; `reasons` says why, per route."""


class RoutesRateLimited(RoutesFailed):
    """A route was passed over for a rate limit: the client should come back later."""


class UpstreamFailed(RoutesFailed):
    """The routes were tried and failed upstream (5xx, connect, timeout, a broken stream)."""


class DeadlineExceeded(RoutesFailed):
    """The request's deadline ran out before any route answered."""


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
    UpstreamFailed: (502, UPSTREAM_FAILED),
    DeadlineExceeded: (504, "request_timeout"),
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
                extra = {"routes": exc.reasons} if isinstance(exc, NoRouteError) else {}
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
