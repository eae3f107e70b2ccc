"""Reading and validating a chat-completions request at the ASGI edge."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.types import Message, Receive, Scope

from meshroute_middleware.core.capabilities import JSON_SCHEMA, NO_NEEDS, TOOLS, VISION
from meshroute_middleware.core.clients import Client
from meshroute_middleware.core.contracts.limits import MAX_ANSWER_TOKENS
from meshroute_middleware.core.objectives import (
    DEFAULT_OBJECTIVE,
    InvalidObjectiveError,
    Objective,
    parse_objective,
)
from meshroute_middleware.core.prefix import Prefix, message_chain
from meshroute_middleware.core.providers.chain import MAX_SESSION_ID_BYTES, SESSION_HEADER
from meshroute_middleware.core.providers.tokens import TokenEstimate, estimate
from meshroute_middleware.endpoints import CHAT_PATH, PATHS, RequestKind, Translation
from meshroute_middleware.http.errors import HttpError, RequestError
from meshroute_middleware.http.shape import (
    MAX_JSON_DEPTH,
    BodyLimits,
    check_messages,
    scan,
    value_bound,
)

__all__ = ["CHAT_PATH", "PATHS", "ChatRequest", "RequestError", "RequestKind", "answer_bound",
           "check_large", "load_object", "loads", "may_continue", "parse_chat", "parse_common",
           "read_body", "replay"]

MAX_PIN_HOPS = 64
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
    needs: frozenset[str] = NO_NEEDS  # capabilities only some routes have (issue 25)
    # the API the client spoke, when not chat completions (chat/dialects: issue 25)
    translation: Translation | None = None
    kind: RequestKind = "chat"  # which endpoint: its upstream path (PATHS), its statistics
    inputs: int | None = None  # embeddings: how many inputs (what its samples count)

    @property
    def path(self) -> str:
        """The path a node serves this kind of request at (a provider's: without `/v1`)."""
        return PATHS[self.kind]
    objective: Objective = DEFAULT_OBJECTIVE  # what it asks its route to be best at (issue 26)
    stream: bool = False  # `"stream": true`
    asks_usage: bool = False  # `"stream_options": {"include_usage": true}` (issue 32)
    # the route (`x-meshroute-route`'s form) an upstream was last sent it on: a request that
    # reached one is charged at least its prompt, whatever its client does (issue 32)
    reached: str | None = None
    # its token estimate, from the one parse of its body (chat requests; None: not read)
    tokens: TokenEstimate | None = None
    continues: bool = True  # `"meshroute": {"continue": false}`: no mid-stream failover


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
        raise HttpError.REQUEST_TIMEOUT.error(
            f"the request body did not arrive within {timeout_s:g} s") from None


async def _read_body(scope: Scope, receive: Receive, limit: int) -> bytes:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                declared = int(value)
            except ValueError:
                raise HttpError.INVALID_REQUEST.error("Content-Length is not a number") from None
            if declared > limit:
                raise _too_large(limit)
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise HttpError.CLIENT_CLOSED.error("client disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise _too_large(limit)
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _too_large(limit: int) -> RequestError:
    return HttpError.REQUEST_TOO_LARGE.error(f"request body exceeds the limit of {limit} bytes")


def loads(body: bytes) -> Any:
    """Parse JSON with orjson (every request's hot path), falling back to the standard
    library for what orjson refuses but Python's json accepts (NaN, lone surrogates), so that
    what is valid does not depend on the parser; ValueError if neither can. orjson reads
    integers past 64 bits as floats: read fields from the result, forward the bytes."""
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return json.loads(body)


def check_large(body: bytes, limits: BodyLimits) -> None:
    """RequestError when a body passes one of `limits`: its values scanned before it is
    parsed (when byte counts cannot rule out too many), then its messages and content parts
    counted (http/shape.py); its depth is `load_object`'s to check. Meant for a worker
    thread: what grows with the body gives up the GIL every few ms, except the parse,
    bounded by `max_json_values`."""
    if value_bound(body) > limits.max_json_values:
        scan(body, limits.max_depth, limits.max_json_values)
    try:
        payload = loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return  # invalid JSON: its reader answers why
    if isinstance(payload, dict):
        check_messages(payload, limits)


H_SESSION = SESSION_HEADER.encode()
H_OBJECTIVE = b"x-meshroute-objective"
# The body's own field for meshroute's per-request options, stripped before forwarding, and
# the options it may hold.
OPTIONS = "meshroute"
OPTION_NAMES = ("objective", "continue")


def header_value(scope: Scope, name: bytes) -> bytes | None:
    """A request header's raw value (the first, when repeated), or None."""
    for key, value in scope.get("headers", ()):
        if key == name:
            return bytes(value)
    return None


def check_session_id(scope: Scope) -> str | None:
    """The request's `x-session-id` (None without one, or when empty); RequestError(400)
    when it is longer than MAX_SESSION_ID_BYTES (each one kept costs memory: issue 22)."""
    found: str | None = None
    for name, value in scope.get("headers", ()):
        if name == H_SESSION:
            if len(value) > MAX_SESSION_ID_BYTES:
                raise HttpError.INVALID_SESSION_ID.error(
                    f"x-session-id is longer than {MAX_SESSION_ID_BYTES} "
                    "bytes")
            found = value.decode("latin-1") or None
    return found


def parse_chat(body: bytes, objective: bytes | None = None,
               session_id: str | None = None, count_tokens: bool = True) -> ChatRequest:
    """Validate the JSON body; strip meshroute's own `route` and `meshroute` fields before
    forwarding. `objective`: the `x-meshroute-objective` header's value, if sent (the body's
    `meshroute.objective` wins over it). `session_id` (the `x-session-id` header) marks the
    prompt's conversation explicitly: a hint that recognises it when its messages no longer
    match (issue 26). `count_tokens`: keep the prompt's token estimate (`tokens`), which only
    a client's admission reads (chat/spend.py); a request of no client skips the count."""
    payload, model, pin, body, chosen = parse_common(body, objective)
    options = payload.get("stream_options")
    return ChatRequest(body, model, pin, answer_bound(payload),
                       message_chain(payload.get("messages"), session_id),
                       needs=request_needs(body, payload), objective=chosen,
                       stream=payload.get("stream") is True,
                       asks_usage=isinstance(options, dict)
                       and options.get("include_usage") is True,
                       tokens=estimate(payload) if count_tokens else None,
                       continues=may_continue(payload))


def parse_common(body: bytes, objective: bytes | None = None
                 ) -> tuple[dict[str, Any], str, list[str] | None, bytes, Objective]:
    """What every routed request is checked for (chat, embeddings, completions): a JSON
    object, not too deep, a `model`, an optional pin (`route`) and meshroute's options
    (`meshroute`, else the `x-meshroute-objective` header's `objective`), both stripped from
    the body; (payload, model, pin, body to forward, objective) or RequestError(400)."""
    payload = load_object(body)
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise HttpError.INVALID_MODEL.error("'model' is required and must be a non-empty string")
    pin = payload.get("route")
    if pin is not None and (not isinstance(pin, list) or not pin or len(pin) > MAX_PIN_HOPS
                            or not all(isinstance(p, str) and p for p in pin)):
        raise HttpError.INVALID_ROUTE.error(
            "'route' must be a non-empty list of node ids (strings)")
    chosen = DEFAULT_OBJECTIVE if objective is None else _objective(
        objective.decode("latin-1"), "the x-meshroute-objective header")
    # Read only when its name is in the bytes (a substring search: plain requests pay next to
    # nothing); a name spelled with JSON escapes is forwarded as sent, its sender's loss.
    options = OPTIONS in payload if b"meshroute" in body else False
    if options:
        chosen = _options(payload[OPTIONS], chosen)
    if pin is not None or options:
        body = _without(body, payload, ("route", OPTIONS))
    return payload, model, pin, body, chosen


def _options(options: object, objective: Objective) -> Objective:
    """The objective of the body's `meshroute` options (else `objective`); RequestError(400)
    for options that are not an object of OPTION_NAMES or a bad objective."""
    if not isinstance(options, dict) or not set(options) <= set(OPTION_NAMES):
        raise HttpError.INVALID_REQUEST.error(
            f"'{OPTIONS}' must be an object with only "
            f"{', '.join(map(repr, OPTION_NAMES))}")
    if not isinstance(options.get("continue", True), bool):
        raise HttpError.INVALID_REQUEST.error(f"'{OPTIONS}.continue' must be true or false")
    if "objective" not in options:
        return objective
    return _objective(options["objective"], f"'{OPTIONS}.objective'")


def may_continue(payload: dict[str, Any]) -> bool:
    """Whether an answer may be continued on another route when its own fails mid-stream
    (issue 34): unless the body's `meshroute.continue` is false (checked by parse_common)."""
    options = payload.get(OPTIONS)
    return not isinstance(options, dict) or options.get("continue") is not False


def _objective(value: object, where: str) -> Objective:
    try:
        return parse_objective(value, where)
    except InvalidObjectiveError as exc:
        raise HttpError.INVALID_OBJECTIVE.error(str(exc)) from None


def load_object(body: bytes) -> dict[str, Any]:
    """A request body's JSON object, or RequestError(400): not JSON, nested deeper than
    MAX_JSON_DEPTH, or not an object (every API's body is read by this one rule)."""
    # Before it is parsed; cheap first: fewer opening brackets than the limit cannot nest
    # deeper than it.
    if body.count(b"[") + body.count(b"{") > MAX_JSON_DEPTH:
        scan(body, MAX_JSON_DEPTH)
    try:
        payload = loads(body)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise HttpError.INVALID_JSON.error(
            "request body is not valid JSON (or nests deeper than "
            f"{MAX_JSON_DEPTH} levels)") from None
    if not isinstance(payload, dict):
        raise HttpError.INVALID_REQUEST.error("request body must be a JSON object")
    return payload


def request_needs(body: bytes, payload: dict[str, Any]) -> frozenset[str]:
    """The capabilities a chat request needs: `vision` for an `image_url` content part,
    `tools` for non-empty `tools` or `functions`, `json_schema` for a `json_schema` response
    format. The fields are read only when their names occur in the bytes (a substring search:
    plain requests pay next to nothing); a name spelled with JSON escapes only misleads the
    routing of its sender's own request."""
    needs: list[str] = []
    if b"image_url" in body and _has_image(payload.get("messages")):
        needs.append(VISION)
    if (b'"tools"' in body or b'"functions"' in body) and (
            payload.get("tools") or payload.get("functions")):
        needs.append(TOOLS)
    if b"json_schema" in body:
        form = payload.get("response_format")
        if isinstance(form, dict) and form.get("type") == "json_schema":
            needs.append(JSON_SCHEMA)
    return frozenset(needs) if needs else NO_NEEDS


def _has_image(messages: object) -> bool:
    """Whether any message's content holds an `image_url` part."""
    if not isinstance(messages, list):
        return False
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(
                isinstance(part, dict) and part.get("type") == "image_url" for part in content):
            return True
    return False


def answer_bound(payload: dict[str, Any]) -> int | None:
    """The client's bound on the answer: `max_completion_tokens`, else `max_tokens`, when a
    positive integer, at most MAX_ANSWER_TOKENS (the body goes on as sent); else None."""
    limit = payload.get("max_completion_tokens", payload.get("max_tokens"))
    if not isinstance(limit, int) or isinstance(limit, bool) or limit <= 0:
        return None
    return min(limit, MAX_ANSWER_TOKENS)


def _without(body: bytes, payload: dict[str, Any], names: tuple[str, ...]) -> bytes:
    """The body re-encoded without the fields `names`, every other value exactly as the
    client sent it (re-read by the standard library, which keeps integers of any size)."""
    try:
        exact = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        exact = payload
    for name in names:
        exact.pop(name, None)
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
