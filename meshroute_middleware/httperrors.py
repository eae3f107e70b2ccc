"""OpenAI-style JSON errors, sent straight over ASGI: a client never sees a traceback."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from starlette.types import Send

ERROR_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 405: "invalid_request_error", 413: "invalid_request_error",
    429: "rate_limit_error", 500: "server_error", 502: "server_error", 503: "server_error",
    504: "server_error",
}


def error_body(status: int, message: str, code: str, **extra: Any) -> bytes:
    """`{"error": {"message", "type", "code", ...}}` as bytes."""
    err = {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "code": code}
    err.update(extra)
    return json.dumps({"error": err}).encode()


async def send_error(send: Send, status: int, message: str, code: str,
                     headers: Iterable[tuple[bytes, bytes]] = (), **extra: Any) -> None:
    """Send a complete OpenAI-style error response."""
    body = error_body(status, message, code, **extra)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})
