"""Other APIs over the one chat path (issue 25): a Dialect turns a request of its API (Anthropic
Messages, OpenAI Responses) into an OpenAI chat-completions request, and every answer (errors
included) back into its API's shape. The attempt lifecycle in between is the chat path's own:
choice, fallback, measurement, limits, client keys and events are never copied."""

from __future__ import annotations

from typing import Protocol

from starlette.types import Send


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


from meshroute_middleware.chat.dialects.responses import RESPONSES_PATH, ResponsesDialect  # noqa: E402

# path -> dialect: one line per API, each in a module of this package.
DIALECTS: dict[str, Dialect] = {
    RESPONSES_PATH: ResponsesDialect(),
}
