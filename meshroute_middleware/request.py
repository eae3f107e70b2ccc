"""Reading and validating a chat-completions request at the ASGI edge."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.types import Message, Receive, Scope

MAX_PIN_HOPS = 64


class RequestError(Exception):
    """A client error with its HTTP status and OpenAI error code."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status, self.code = status, code


@dataclass(slots=True)
class ChatRequest:
    """A parsed chat request: the bytes to forward, the model, an optional pinned route."""

    body: bytes
    payload: dict[str, Any]
    model: str
    pin: list[str] | None
    stream: bool


async def read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    """The whole request body, or RequestError(413) as soon as it exceeds `limit`."""
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise RequestError(400, "Content-Length is not a number",
                                   "invalid_request") from None
            if declared > limit:
                raise _too_large(limit)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestError(499, "client disconnected", "client_closed")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(limit: int) -> RequestError:
    return RequestError(413, f"request body exceeds the limit of {limit} bytes",
                        "request_too_large")


def parse_chat(body: bytes) -> ChatRequest:
    """Validate the JSON body; strip meshroute's own `route` field before forwarding."""
    try:
        payload = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise RequestError(400, "request body is not valid JSON", "invalid_json") from None
    if not isinstance(payload, dict):
        raise RequestError(400, "request body must be a JSON object", "invalid_request")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(400, "'model' is required and must be a non-empty string",
                           "invalid_model")
    pin = payload.get("route")
    if pin is not None:
        if (not isinstance(pin, list) or not pin or len(pin) > MAX_PIN_HOPS
                or not all(isinstance(p, str) and p for p in pin)):
            raise RequestError(400, "'route' must be a non-empty list of node ids (strings)",
                               "invalid_route")
        payload = {k: v for k, v in payload.items() if k != "route"}
        body = json.dumps(payload).encode()
    return ChatRequest(body, payload, model, pin, payload.get("stream") is True)


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands out the body once, then delegates (FACTS.md: never loop the body)."""
    sent = False

    async def _receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return _receive
