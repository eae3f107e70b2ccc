"""An aliased request's answer names the model the client asked for (issue 25: `[aliases]`).

Only when an alias applied: the `model` fields of a JSON answer (held until complete, to set its
Content-Length again) and of each SSE event (rewritten line by line as they pass: a stream is
never held back by more than the part of a line not yet arrived).
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


def with_model(req: ChatRequest, model: str) -> ChatRequest:
    """The request with `model` in its body and its record (every other value as sent)."""
    body = json.loads(req.body)
    body["model"] = model
    return replace(req, body=json.dumps(body).encode(), model=model)


def answer_model(send: Send, asked: str) -> Send:
    """A send that rewrites the answer's `model` fields to `asked`."""
    return _AnswerModel(send, asked).send


class _AnswerModel:
    """Rewrites JSON and SSE answers; anything else passes untouched."""

    def __init__(self, send: Send, asked: str) -> None:
        self._send = send
        self._field = b'"model":' + json.dumps(asked).encode()
        self._mode = ""  # "json", "sse" or "" (untouched)
        self._start: Message | None = None  # a JSON answer's start, held for its length
        self._held: list[bytes] = []  # a JSON body so far, or an SSE line not yet complete

    def _rewrite(self, data: bytes) -> bytes:
        return _MODEL.sub(self._field, data) if b'"model"' in data else data

    async def send(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            await self._on_start(message)
        elif kind == "http.response.body" and self._mode == "json":
            await self._on_json(message)
        elif kind == "http.response.body" and self._mode == "sse":
            await self._on_sse(message)
        else:
            await self._send(message)

    async def _on_start(self, message: Message) -> None:
        headers = list(message.get("headers", ()))
        kind = next((v for k, v in headers if k.lower() == b"content-type"), b"")
        if kind.startswith(b"application/json"):
            self._mode, self._start = "json", message
            return
        if kind.startswith(b"text/event-stream"):
            self._mode = "sse"  # its length changes with the model's name
            message = {**message, "headers": [(k, v) for k, v in headers
                                              if k.lower() != b"content-length"]}
        await self._send(message)

    async def _on_json(self, message: Message) -> None:
        self._held.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        body = self._rewrite(b"".join(self._held))
        self._held = []
        start = self._start
        assert start is not None
        headers = [(k, v) for k, v in start.get("headers", ()) if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self._send({**start, "headers": headers})
        await self._send({"type": "http.response.body", "body": body, "more_body": False})

    async def _on_sse(self, message: Message) -> None:
        data = b"".join((*self._held, message.get("body", b"")))
        more = message.get("more_body", False)
        cut = data.rfind(b"\n") + 1 if more else len(data)
        self._held = [data[cut:]] if cut < len(data) else []
        await self._send({**message, "body": self._rewrite(data[:cut])})
