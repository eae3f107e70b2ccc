"""Reading and validating the other routed endpoints (issue 25): `POST /v1/embeddings` and
`POST /v1/completions`. Each is a ChatRequest of its own `kind`, so the one attempt lifecycle
serves it; what differs is checked here, with a 400 that names the field."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from meshroute_middleware.core.prefix import message_chain
from meshroute_middleware.http.errors import HttpError
from meshroute_middleware.http.request import (
    ChatRequest,
    RequestKind,
    answer_bound,
    may_continue,
    parse_chat,
    parse_common,
)

MAX_INPUTS = 2048  # inputs of one embeddings request (OpenAI's limit)
# What a kind needs of a route (the capability names of issue 25), set as the request's
# `needs`; chat's (vision, tools, ...) come from its body (request.request_needs).
NEEDS: dict[RequestKind, frozenset[str]] = {
    "chat": frozenset(), "embeddings": frozenset({"embeddings"}),
    "completions": frozenset({"completions"})}


def _is_token(value: Any) -> bool:
    return type(value) is int and value >= 0


def _is_tokens(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(map(_is_token, value))


def count_inputs(raw: Any) -> int | None:
    """How many inputs `input`/`prompt` holds (a string, a non-empty list of strings, a token
    array, a list of token arrays), or None when it is none of these."""
    if isinstance(raw, str):
        return 1 if raw else None
    if _is_tokens(raw):
        return 1
    if isinstance(raw, list) and raw and (all(isinstance(i, str) and i for i in raw)
                                          or all(map(_is_tokens, raw))):
        return len(raw)
    return None


def parse_embeddings(body: bytes, objective: bytes | None = None,
                     session_id: str | None = None) -> ChatRequest:
    """An embeddings request: `model`, `input` (up to MAX_INPUTS), optional `dimensions`
    and `encoding_format`; RequestError(400) naming what is wrong."""
    payload, model, pin, body, chosen = parse_common(body, objective)
    inputs = count_inputs(payload.get("input"))
    if inputs is None or inputs > MAX_INPUTS:
        raise HttpError.INVALID_INPUT.error(
            "'input' must be a non-empty string, a list of at most "
            f"{MAX_INPUTS} non-empty strings, a token array (non-negative "
            "integers) or a list of token arrays")
    dimensions = payload.get("dimensions")
    if dimensions is not None and not (type(dimensions) is int and dimensions > 0):
        raise HttpError.INVALID_DIMENSIONS.error("'dimensions' must be a positive integer")
    if payload.get("encoding_format", "float") not in ("float", "base64"):
        raise HttpError.INVALID_ENCODING_FORMAT.error(
            "'encoding_format' must be 'float' or 'base64'")
    return ChatRequest(body, model, pin, needs=NEEDS["embeddings"], kind="embeddings",
                       inputs=inputs, objective=chosen)


def parse_completion(body: bytes, objective: bytes | None = None,
                     session_id: str | None = None) -> ChatRequest:
    """A (legacy) completions request: `model`, `prompt`, optional `max_tokens` (a positive
    integer) and `stream` (a boolean); RequestError(400) naming what is wrong."""
    payload, model, pin, body, chosen = parse_common(body, objective)
    prompt = payload.get("prompt")
    if count_inputs(prompt) is None:
        raise HttpError.INVALID_PROMPT.error(
            "'prompt' must be a non-empty string, a list of strings, a "
            "token array or a list of token arrays")
    limit = payload.get("max_tokens")
    if limit is not None and not (type(limit) is int and limit > 0):
        raise HttpError.INVALID_MAX_TOKENS.error("'max_tokens' must be a positive integer")
    if not isinstance(payload.get("stream", False), bool):
        raise HttpError.INVALID_STREAM.error("'stream' must be true or false")
    prefix = (message_chain([{"role": "user", "content": prompt}], session_id)
              if isinstance(prompt, str) else None)
    return ChatRequest(body, model, pin, answer_bound(payload), prefix,
                       needs=NEEDS["completions"], kind="completions", objective=chosen,
                       stream=payload.get("stream") is True, continues=may_continue(payload))


# (body, the x-meshroute-objective header, the x-session-id header) -> the request
PARSERS: dict[RequestKind, Callable[[bytes, bytes | None, str | None], ChatRequest]] = {
    "chat": parse_chat, "embeddings": parse_embeddings, "completions": parse_completion}
