"""The OpenAI-style JSON error body: `{"error": {"message", "type", "code", ...}}`.

Every HTTP error a client can see carries it (the gateway, the node emulator) and so does the
SSE event that ends a stream whose upstream died.
"""

from __future__ import annotations

import json
from typing import Any

# The OpenAI error `type` for an HTTP status; any other status is a "server_error".
ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error",
    413: "invalid_request_error", 421: "invalid_request_error", 431: "invalid_request_error",
    429: "rate_limit_error", 500: "server_error", 502: "server_error", 503: "server_error",
    504: "server_error",
}


def error_type(status: int) -> str:
    """The OpenAI error `type` of an HTTP status."""
    return ERROR_TYPES.get(status, "server_error")


def error_object(message: str, code: str, type_: str, **extra: Any) -> dict[str, Any]:
    """`{"error": {"message", "type", "code", **extra}}` as a JSON-ready dict."""
    err: dict[str, Any] = {"message": message, "type": type_, "code": code}
    err.update(extra)
    return {"error": err}


def error_body(status: int, message: str, code: str, **extra: Any) -> bytes:
    """The error body of an HTTP answer with `status`, as bytes."""
    return json.dumps(error_object(message, code, error_type(status), **extra)).encode()


def error_message(body: Any) -> str | None:
    """The message of a decoded error body, or None when `body` is not one."""
    try:
        message = body["error"]["message"]
    except (KeyError, TypeError, IndexError):
        return None
    return message if isinstance(message, str) else None


def sse_error_event(message: str, code: str = "upstream_failed") -> bytes:
    """The error as one SSE event, to end a stream whose upstream died."""
    return b"data: " + json.dumps(error_object(message, code, "server_error")).encode() + b"\n\n"
