"""Reading and validating a chat-completions request at the ASGI edge."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import Message, Receive, Scope

from meshroute_middleware.core.clients import Client
from meshroute_middleware.core.contracts.limits import MAX_ANSWER_TOKENS
from meshroute_middleware.core.prefix import Prefix, message_chain
from meshroute_middleware.core.providers.chain import MAX_SESSION_ID_BYTES
from meshroute_middleware.http.errors import RequestError

__all__ = ["ChatRequest", "RequestError", "answer_bound", "loads", "parse_chat", "read_body",
           "replay"]

MAX_PIN_HOPS = 64
# Deeper JSON is refused before anything is forwarded: our parser would recurse (the standard
# library past ~1,000 levels raises RecursionError) and a node's parser may break on less.
MAX_JSON_DEPTH = 128
DEFAULT_BODY_TIMEOUT_S = 30.0  # the whole body must arrive within this (slowloris: 408)


@dataclass(slots=True)
class ChatRequest:
    """A parsed chat request: the bytes to forward, the model, an optional pinned route."""

    body: bytes
    model: str
    pin: list[str] | None
    max_tokens: int | None = None  # the client's bound on the answer: measurements clamp to it
    # The prompt's chain of message hashes (no text): recognises a returning conversation.
    prefix: Prefix | None = None
    client: Client | None = None  # who sends it, when `[[clients]]` are configured (issue 24)


async def read_body(scope: Scope, receive: Receive, limit: int,
                    timeout_s: float | None = None) -> bytes:
    """The whole request body, or RequestError(413) as soon as it exceeds `limit`, or
    RequestError(408) when it has not all arrived within `timeout_s`."""
    if timeout_s is None:
        return await _read_body(scope, receive, limit)
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_body(scope, receive, limit)
    except TimeoutError:
        raise RequestError(408, f"the request body did not arrive within {timeout_s:g} s",
                           "request_timeout") from None


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
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


def loads(body: bytes) -> Any:
    """Parse JSON with orjson (every request's hot path), falling back to the standard
    library for what orjson refuses but Python's json accepts (NaN, lone surrogates), so that
    what is valid does not depend on the parser; ValueError if neither can. orjson reads
    integers past 64 bits as floats: read fields from the result, forward the bytes."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body)


def _too_deep(payload: Any, limit: int) -> bool:
    """Whether a parsed value nests containers deeper than `limit` (iteratively)."""
    stack: list[tuple[Any, int]] = [(payload, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values() if isinstance(v, dict | list))
        elif isinstance(value, list):
            stack.extend((v, depth + 1) for v in value if isinstance(v, dict | list))
    return False


H_SESSION = b"x-session-id"


def check_session_id(scope: Scope) -> str | None:
    """The request's `x-session-id` (None without one, or when empty); RequestError(400)
    when it is longer than MAX_SESSION_ID_BYTES (each one kept costs memory: issue 22)."""
    found: str | None = None
    for name, value in scope.get("headers", ()):
        if name == H_SESSION:
            if len(value) > MAX_SESSION_ID_BYTES:
                raise RequestError(400, f"x-session-id is longer than {MAX_SESSION_ID_BYTES} "
                                   "bytes", "invalid_session_id")
            found = value.decode("latin-1") or None
    return found


def parse_chat(body: bytes, session_id: str | None = None) -> ChatRequest:
    """Validate the JSON body; strip meshroute's own `route` field before forwarding.
    `session_id` (the `x-session-id` header) marks the prompt's conversation explicitly: a
    hint that recognises it when its messages no longer match (issue 26)."""
    try:
        payload = loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise RequestError(400, "request body is not valid JSON (or nests deeper than "
                           f"{MAX_JSON_DEPTH} levels)", "invalid_json") from None
    # Cheap first: fewer opening brackets than the limit cannot nest deeper than it.
    if (body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH
            and _too_deep(payload, MAX_JSON_DEPTH)):
        raise RequestError(400, f"request body nests deeper than {MAX_JSON_DEPTH} levels",
                           "invalid_json")
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
        body = _without_route(body, payload)
    return ChatRequest(body, model, pin, answer_bound(payload),
                       message_chain(payload.get("messages"), session_id))


def answer_bound(payload: dict[str, Any]) -> int | None:
    """The client's bound on the answer: `max_completion_tokens`, else `max_tokens`, when a
    positive integer, at most MAX_ANSWER_TOKENS (the body goes on as sent); else None."""
    limit = payload.get("max_completion_tokens", payload.get("max_tokens"))
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        return None
    return min(limit, MAX_ANSWER_TOKENS)


def _without_route(body: bytes, payload: dict[str, Any]) -> bytes:
    """The body re-encoded without `route`, every other value exactly as the client sent it
    (re-read by the standard library, which keeps integers of any size)."""
    try:
        exact = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        exact = payload
    exact.pop("route", None)
    return json.dumps(exact).encode()


def replay(body: bytes, receive: Receive) -> Receive:
    """A receive that hands out the body once, then delegates to the client's: the app still
    hears `http.disconnect`, and never gets the body a second time."""
    sent = False

    async def _receive() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return _receive
