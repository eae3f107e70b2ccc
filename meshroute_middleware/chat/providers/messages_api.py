"""Which API a provider attempt speaks (issue 25): a provider model with `api = "anthropic"`
is called at `{base_url}/messages` with Anthropic's headers; a /v1/messages request reaches it
untranslated (`native_of`), any other translated to Messages (`reverse`)."""

from __future__ import annotations

import json
from typing import Any

from meshroute_middleware.chat.dialects import Native
from meshroute_middleware.chat.dialects.wire.anthropic import (
    ANTHROPIC_VERSION,
    error_object,
    stream_failed,
)
from meshroute_middleware.chat.dialects.wire.anthropic_chat import messages_request
from meshroute_middleware.chat.providers.request import ChainRequest
from meshroute_middleware.core.contracts.error_body import sse_error_event
from meshroute_middleware.core.providers.chain import Candidate

_CLIENT_HEADERS = (b"anthropic-version", b"anthropic-beta")  # the client's, passed on


def native_of(cr: ChainRequest, c: Candidate) -> Native | None:
    """The request's translation when candidate `c` speaks the client's API itself."""
    translation = cr.ex.req.translation
    if (c.model is None or c.model.api == "openai" or not isinstance(translation, Native)
            or translation.api != c.model.api):
        return None
    return translation


def reverse(cr: ChainRequest, c: Candidate) -> bool:
    """Whether candidate `c` speaks Messages and the request must be translated to it."""
    return c.model is not None and c.model.api == "anthropic" and native_of(cr, c) is None


def request_payload(cr: ChainRequest, c: Candidate) -> dict[str, Any]:
    """The body candidate `c` gets (its model id set by the caller): the chat request, the
    client's Messages body as sent, or the chat request translated to Messages."""
    native = native_of(cr, c)
    if native is not None:
        payload: dict[str, Any] = json.loads(native.body)  # validated by the dialect
        return payload
    return messages_request(cr.payload, c.upstream_model) if reverse(cr, c) else cr.payload


def messages_headers(cr: ChainRequest, key: str) -> list[tuple[bytes, bytes]]:
    """A Messages call's headers: the key as `x-api-key`, the client's `anthropic-version`
    (else ANTHROPIC_VERSION) and `anthropic-beta`; no other header of the client's."""
    theirs = {k: v for k, v in cr.ex.scope.get("headers", ()) if k in _CLIENT_HEADERS}
    return [(b"content-type", b"application/json"), (b"x-api-key", key.encode()),
            (b"anthropic-version", theirs.pop(b"anthropic-version",
                                              ANTHROPIC_VERSION.encode())),
            *theirs.items()]


def messages_error(status: int, message: str) -> bytes:
    """An error body of our own, in Anthropic's shape."""
    return json.dumps(error_object(status, message)).encode()


def broken_event(message: str, native: bool) -> bytes:
    """The event that ends a stream cut mid-way, in the client's API."""
    return stream_failed(message) if native else sse_error_event(message)
