"""The gateway's routed URL paths and the protocols of the APIs served over its chat path.

Both `http/` (which parses, guards and answers requests) and `chat/` (which implements the
dialects) need these; they live here, below both, so that neither imports the other's way up.
"""

from __future__ import annotations

from typing import Literal, Protocol

from starlette.types import Send

__all__ = ["CHAT_PATH", "COUNT_TOKENS_PATH", "DIALECT_PATHS", "MESSAGES_PATH", "PATHS",
           "RESPONSES_PATH", "Dialect", "RequestKind", "Translation"]

# The routed endpoints (issue 25): each kind's path, the same on the gateway, on a node and,
# without its `/v1`, below a provider's base URL.
RequestKind = Literal["chat", "embeddings", "completions"]
CHAT_PATH = "/v1/chat/completions"
PATHS: dict[RequestKind, str] = {"chat": CHAT_PATH, "embeddings": "/v1/embeddings",
                                 "completions": "/v1/completions"}

# The other APIs over the chat path (chat/dialects): Anthropic Messages, OpenAI Responses.
MESSAGES_PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
RESPONSES_PATH = "/v1/responses"
DIALECT_PATHS = frozenset({MESSAGES_PATH, COUNT_TOKENS_PATH, RESPONSES_PATH})


class Translation(Protocol):
    """One request being translated; made before the body is read, so that even the errors
    answered before it (413, 401, ...) leave in the dialect's shape."""

    send: Send  # the client's send, as this API's answers: OpenAI-shaped answers pass into it

    def request(self, body: bytes) -> bytes:
        """The OpenAI chat-completions body for this API's `body` (RequestError when it is
        invalid); from now on `send` translates a success answer too."""
        ...


class Dialect(Protocol):
    """One API served over the chat path, at its own URL path."""

    path: str

    def open(self, send: Send) -> Translation:
        """Start translating one request whose answer goes to `send`."""
        ...
