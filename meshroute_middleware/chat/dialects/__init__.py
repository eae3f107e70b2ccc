"""Other APIs over the one chat path (issue 25): a Dialect turns a request of its API (Anthropic
Messages, OpenAI Responses) into an OpenAI chat-completions request, and every answer (errors
included) back into its API's shape. The attempt lifecycle in between is the chat path's own:
choice, fallback, measurement, limits, client keys and events are never copied."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from meshroute_middleware.endpoints import Dialect, Translation

__all__ = ["DIALECTS", "Dialect", "Local", "Native", "Translation"]


@runtime_checkable
class Native(Protocol):
    """A Translation whose API some routes speak themselves (a provider model with
    `api = "anthropic"`): such a route gets `body` as the client sent it, and after `relay()`
    `send` passes the route's answers on as they are."""

    api: str  # the API's name, as a provider model's `api` spells it
    body: bytes  # the client's request body, as sent (set by `request`)

    def relay(self) -> None:
        """The answers from now on are already in this API's shape."""
        ...


@runtime_checkable
class Local(Protocol):
    """A Translation that answers the request itself (count_tokens): nothing is routed."""

    async def answer(self) -> None:
        """Send the answer, computed from the request given to `request`."""
        ...


# path -> dialect: one line per API, each in a module of this package (imported last: the
# modules implement the protocols above).
from meshroute_middleware.chat.dialects import anthropic  # noqa: E402
from meshroute_middleware.chat.dialects.responses import ResponsesDialect  # noqa: E402
from meshroute_middleware.endpoints import RESPONSES_PATH  # noqa: E402

DIALECTS: dict[str, Dialect] = {
    anthropic.MESSAGES_PATH: anthropic.MESSAGES,
    anthropic.COUNT_TOKENS_PATH: anthropic.COUNT_TOKENS,
    RESPONSES_PATH: ResponsesDialect(),
}
