"""Anthropic's Messages API over the chat path: `POST /v1/messages` and
`POST /v1/messages/count_tokens` (issue 25).

The request is translated to chat completions (chat/dialects/wire/anthropic.py); every answer of
the chat path passes through `MessagesTranslation.send`: a chat completion becomes a
`message`, an SSE stream Anthropic's events (translated as it passes), every OpenAI-shaped
error `{"type": "error", "error": {"type", "message"}}` with its status and headers
(Retry-After included). A route that speaks Messages itself (`api = "anthropic"`) calls
`relay()`: its answer passes untouched. count_tokens is answered here, routed nowhere.
"""

from __future__ import annotations

import json
import secrets

from starlette.types import Message, Send

from meshroute_middleware.chat.dialects.wire.anthropic import (
    Asked,
    MessagesError,
    chat_request,
    error_object,
    message,
)
from meshroute_middleware.chat.dialects.wire.anthropic_stream import MessageStream
from meshroute_middleware.chat.headers import is_sse
from meshroute_middleware.core.contracts.error_body import error_message
from meshroute_middleware.core.providers.tokens import estimate
from meshroute_middleware.endpoints import COUNT_TOKENS_PATH, MESSAGES_PATH
from meshroute_middleware.http.errors import HttpError
from meshroute_middleware.http.request import loads

__all__ = ["COUNT_TOKENS", "COUNT_TOKENS_PATH", "MESSAGES", "MESSAGES_PATH",
           "CountTokensDialect", "MessagesDialect", "MessagesTranslation"]

_DROPPED = frozenset({b"content-length", b"content-type", b"content-encoding"})
MAX_ANSWER_BYTES = 32 * 1024 * 1024  # a JSON answer held to translate it (as call.py holds)


def message_id() -> str:
    """A new Messages id (`msg_` and 24 hex digits)."""
    return "msg_" + secrets.token_hex(12)


class MessagesTranslation:
    """One /v1/messages request: its body translated, its answers turned into Messages'."""

    api = "anthropic"
    count_only = False

    def __init__(self, send: Send) -> None:
        self._client = send
        self.body = b""
        self.asked: Asked | None = None
        self.input_tokens = 0  # the translated prompt's estimate: usage when none comes
        self._native = False
        self._start: Message | None = None  # a JSON answer's start, held until its body ends
        self._held: list[bytes] = []
        self._held_bytes = 0  # past MAX_ANSWER_BYTES the rest is dropped: a 502 instead
        self._stream: MessageStream | None = None
        self.send: Send = self._send  # the client's send for an OpenAI-shaped answer

    def request(self, body: bytes) -> bytes:
        """The chat-completions body (RequestError 400 when the request is not valid)."""
        try:
            payload = loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            raise HttpError.INVALID_JSON.error("the request body is not valid JSON") from None
        try:
            chat, self.asked = chat_request(payload, count_only=self.count_only)
        except MessagesError as exc:
            raise HttpError.INVALID_REQUEST.error(str(exc)) from None
        self.body = body
        self.input_tokens = estimate(chat).prompt
        return json.dumps(chat).encode()

    def relay(self) -> None:
        """The route speaks Messages: its answers pass as they are."""
        self._native = True

    async def _send(self, message: Message) -> None:
        if self._native:
            await self._client(message)
        elif message["type"] == "http.response.start":
            await self._begin(message)
        elif message["type"] == "http.response.body":
            await self._body(message)
        else:
            await self._client(message)

    async def _begin(self, start: Message) -> None:
        status = int(start["status"])
        headers = list(start.get("headers", ()))
        if self.asked is not None and status < 400 and is_sse(headers):
            self._stream = MessageStream(self.asked, message_id(), self.input_tokens)
            kept = [(k, v) for k, v in headers if k.lower() not in _DROPPED]
            await self._client({**start, "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"), *kept]})
        else:
            self._start = start

    async def _body(self, part: Message) -> None:
        chunk, more = part.get("body", b""), part.get("more_body", False)
        if self._stream is not None:
            out = self._stream.feed(chunk) + (b"" if more else self._stream.close())
            if out or not more:
                await self._client({"type": "http.response.body", "body": out,
                                    "more_body": more})
            return
        self._held_bytes += len(chunk)
        if self._held_bytes <= MAX_ANSWER_BYTES:
            self._held.append(chunk)
        else:
            self._held.clear()
        if more or self._start is None:
            return
        start, body = self._start, b"".join(self._held)
        self._held.clear()
        status, answer = (self._translated(int(start["status"]), body)
                          if self._held_bytes <= MAX_ANSWER_BYTES else
                          self._invalid("the route's answer is larger than meshroute holds"))
        kept = [(k, v) for k, v in start.get("headers", ()) if k.lower() not in _DROPPED]
        await self._client({"type": "http.response.start", "status": status, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(answer)).encode()), *kept]})
        await self._client({"type": "http.response.body", "body": answer, "more_body": False})

    @staticmethod
    def _invalid(message: str) -> tuple[int, bytes]:
        """The answer for a route's answer that cannot be translated."""
        status = HttpError.UPSTREAM_ANSWER_INVALID.status
        return status, json.dumps(error_object(status, message)).encode()

    def _translated(self, status: int, body: bytes) -> tuple[int, bytes]:
        """A whole JSON answer in Messages' shape (an error for what cannot be read)."""
        try:
            decoded = json.loads(body) if body else None
        except (ValueError, UnicodeDecodeError, RecursionError):
            decoded = None
        if status >= 400:
            text = error_message(decoded) or (body[:500].decode("utf-8", "replace").strip()
                                              or f"the route answered HTTP {status}")
            return status, json.dumps(error_object(status, text)).encode()
        if self.asked is None:  # an answer to no request of ours: passed as it is
            return status, body
        if not isinstance(decoded, dict) or not isinstance(decoded.get("choices"), list):
            return self._invalid("the route's answer is not a chat completion")
        return status, json.dumps(message(decoded, self.asked, message_id(),
                                          self.input_tokens)).encode()


class CountTokensTranslation(MessagesTranslation):
    """One count_tokens request: answered here with the translated request's estimate."""

    count_only = True

    async def answer(self) -> None:
        body = json.dumps({"input_tokens": self.input_tokens}).encode()
        await self._client({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode())]})
        await self._client({"type": "http.response.body", "body": body, "more_body": False})


class MessagesDialect:
    """`POST /v1/messages`."""

    path = MESSAGES_PATH

    def open(self, send: Send) -> MessagesTranslation:
        return MessagesTranslation(send)


class CountTokensDialect:
    """`POST /v1/messages/count_tokens`."""

    path = COUNT_TOKENS_PATH

    def open(self, send: Send) -> CountTokensTranslation:
        return CountTokensTranslation(send)


MESSAGES = MessagesDialect()
COUNT_TOKENS = CountTokensDialect()
