"""OpenAI-style JSON errors, sent straight over ASGI: a client never sees a traceback."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from starlette.types import Send

from meshroute_middleware.core.contracts.error_body import ERROR_TYPES, error_body

__all__ = ["ERROR_TYPES", "error_body", "send_error"]


async def send_error(send: Send, status: int, message: str, code: str,
                     headers: Iterable[tuple[bytes, bytes]] = (), **extra: Any) -> None:
    """Send a complete OpenAI-style error response."""
    body = error_body(status, message, code, **extra)
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})
