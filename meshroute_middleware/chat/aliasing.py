"""An aliased request's answer names the model the client asked for (issue 25: `[aliases]`).

Only when an alias applied: the `model` fields of a JSON answer or an SSE stream are rewritten
as the bytes pass. Nothing is held but a tail that may be the start of a `"model": "..."`
member not yet complete (at most MAX_HELD_BYTES): a stream is never held back, and an answer
that breaks off still ends as it would have (its length changes, so it goes without
Content-Length: chunked, and a broken one ends without the terminator).
"""

from __future__ import annotations

import json
import re
from dataclasses import replace

from starlette.types import Message, Send

from meshroute_middleware.http.request import ChatRequest

# A `"model": "..."` member; inside a JSON string its quotes would be escaped, so text in a
# message's content cannot match.
_MODEL = re.compile(rb'"model"\s*:\s*"(?:[^"\\]|\\.)*"')
# ... and what may still become one when more bytes come
_OPEN = re.compile(rb'"model"\s*(?::\s*(?:"(?:[^"\\]|\\.)*\\?)?)?')
_KEY = b'"model"'
MAX_HELD_BYTES = 4096  # a model name longer than this is passed on as it is
_REWRITTEN = (b"application/json", b"text/event-stream")


def with_model(req: ChatRequest, model: str) -> ChatRequest:
    """The request with `model` in its body and its record (every other value as sent)."""
    body = json.loads(req.body)
    body["model"] = model
    return replace(req, body=json.dumps(body).encode(), model=model)


def answer_model(send: Send, asked: str) -> Send:
    """A send that rewrites the answer's `model` fields to `asked`."""
    return _AnswerModel(send, asked).send


def split_open(data: bytes) -> int:
    """Where a tail that may be an incomplete `"model"` member begins (len(data): none)."""
    i = data.rfind(_KEY)
    floor = 0  # a tail to hold starts after the last member found complete
    if i >= 0:
        if _OPEN.fullmatch(data, i) is not None:
            return i
        done = _MODEL.match(data, i)
        floor = done.end() if done is not None else i + 1
    for k in range(min(len(_KEY) - 1, len(data) - floor), 0, -1):  # `"mod` at the very end
        if data.endswith(_KEY[:k]):
            return len(data) - k
    return len(data)


class _AnswerModel:
    """Rewrites JSON and SSE answers; anything else passes untouched."""

    def __init__(self, send: Send, asked: str) -> None:
        self._send = send
        self._field = b'"model":' + json.dumps(asked).encode()
        self._on = False  # the answer is JSON or SSE
        self._held = b""

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            headers = list(message.get("headers", ()))
            form = next((v for k, v in headers if k.lower() == b"content-type"), b"")
            self._on = form.startswith(_REWRITTEN)
            if self._on:
                message = {**message, "headers": [(k, v) for k, v in headers
                                                  if k.lower() != b"content-length"]}
        elif kind == "http.response.body" and self._on:
            message = {**message, "body": self._rewrite(message)}
        await self._send(message)

    def _rewrite(self, message: Message) -> bytes:
        data = self._held + message.get("body", b"")
        cut = split_open(data) if message.get("more_body", False) else len(data)
        if len(data) - cut > MAX_HELD_BYTES:
            cut = len(data)
        self._held = data[cut:]
        out = data[:cut]
        return _MODEL.sub(self._field, out) if _KEY in out else out
