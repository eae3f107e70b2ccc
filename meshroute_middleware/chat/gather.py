"""Mid-stream failover for requests that are not streamed (issue 34): to know what a route had
said when it died, the gateway asks it for a stream and gathers the stream into the one JSON
answer the client asked for.

Only where it can help: a chat or completions request that may be continued
(`meshroute.continue` not false), asks for no tools, logprobs or several choices (none of
which is continued), and whose model has another route that can continue it (`gathers`).
`Gathering` is the client's `send` for such a request: a stream passes through it into a
`chat.completion` (or `text_completion`) object sent whole at the end, with
`x-meshroute-attempts` and the `meshroute` field when the answer was continued; a stream that
ended with an error event becomes a 502 `upstream_failed`, one whose text outgrew
MAX_GATHERED_TEXT a 502 `invalid_upstream_answer`; an answer that is not a stream (an error)
passes as it came. A provider chain gathers alike (chat/providers/continued.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.types import Message, Send

from meshroute_middleware.chat.continuation import (
    can_continue,
    constrained,
    json_object,
)
from meshroute_middleware.chat.headers import H_ATTEMPTS, Headers, is_sse
from meshroute_middleware.core import Decision
from meshroute_middleware.http.errors import HttpError
from meshroute_middleware.http.request import ChatRequest

# request fields whose answers are not continued (a tool call, logprobs, several choices)
_NOT_CONTINUED = ("tools", "functions", "logprobs", "n", "best_of", "echo")
_NAMED = (*(f'"{k}"'.encode() for k in _NOT_CONTINUED), b'"stream')
_STREAMED = b', "stream": true, "stream_options": {"include_usage": true}'
_DROPPED = frozenset({b"content-type", b"content-length", b"content-encoding"})
# Characters of text a gathered answer holds (content, reasoning, tool arguments): 4 Mi is ~1M
# tokens, past any answer a bound allows (MAX_ANSWER_TOKENS), as a transcript keeps
# (MAX_TRANSCRIPT_BYTES); past it, a 502 instead of the answer.
MAX_GATHERED_TEXT = 4 * 1024 * 1024


def gathers(req: ChatRequest, first: Decision) -> bytes | None:
    """The streamed body to send in place of `req`'s when its answer is to be gathered from
    a stream (see the module's docstring); None to forward it as it is. The body is parsed
    only when it names a field that may stop it (a substring search first)."""
    if req.stream or not req.continues or req.kind not in ("chat", "completions"):
        return None
    if not any(can_continue(r) for r in first.alternatives()):
        return None
    return streamed(req)


def streamed(req: ChatRequest) -> bytes | None:
    """`req`'s body asking for a stream with its usage, when its answer may be continued
    (not streamed, no `continue: false`, no tools, logprobs, several choices or constrained
    format); None when it is not to be gathered."""
    if req.stream or not req.continues or req.kind not in ("chat", "completions"):
        return None
    body = req.body
    if constrained(body):
        return None
    if not any(name in body for name in _NAMED):
        end = body.rfind(b"}")
        return None if end < 0 else body[:end] + _STREAMED + body[end:]
    payload = json_object(body)
    if payload is None or any(payload.get(k) not in (None, False, 1) for k in _NOT_CONTINUED):
        return None
    payload["stream"] = True
    payload["stream_options"] = {"include_usage": True}
    return json.dumps(payload).encode()


class Gathering:
    """The `send` of a request whose answer is gathered from a stream: each event is folded
    into the answer as it comes (what is kept is the answer's text, not the stream's bytes)."""

    __slots__ = ("_answer", "_client", "_fresh", "_line", "_start", "kind")

    def __init__(self, send: Send, kind: str,
                 fresh: Callable[[], Headers] | None = None) -> None:
        self._client = send
        self.kind = kind
        self._fresh = fresh  # the path's own `x-meshroute-*` headers, as they are at the end
        self._start: Message | None = None
        self._answer: Gathered | None = None  # None: not a stream, passed on as it came
        self._line = b""  # a line not yet whole

    @property
    def client(self) -> Send:
        """The send the gathered answer goes to."""
        return self._client

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            if is_sse(message.get("headers", ())):
                self._start, self._answer = message, Gathered(self.kind)
                return
        elif self._answer is not None and message["type"] == "http.response.body":
            lines = (self._line + message.get("body", b"")).split(b"\n")
            self._line = lines.pop()
            self._answer.feed(lines)
            if message.get("more_body", False):
                return
            self._answer.feed([self._line])
            await self._send(self._answer)
            return
        await self._client(message)

    async def _send(self, gathered: Gathered) -> None:
        assert self._start is not None
        fresh = [] if self._fresh is None else self._fresh()
        if gathered.size > MAX_GATHERED_TEXT:
            await HttpError.UPSTREAM_ANSWER_INVALID.send(
                self._client, f"the route's answer is larger than meshroute gathers "
                f"({MAX_GATHERED_TEXT:,} characters of text)", fresh)
            return
        answer = gathered.result()
        if answer is None:
            await HttpError.UPSTREAM_FAILED.send(
                self._client, "the route failed mid-answer and it could not be continued", fresh)
            return
        body = json.dumps(answer).encode()
        meshroute = answer.get("meshroute")
        if isinstance(meshroute, dict) and not fresh:
            fresh = [(H_ATTEMPTS, str(meshroute.get("attempts", 1)).encode())]
        names = {k for k, _ in fresh}
        headers = [(k, v) for k, v in self._start.get("headers", ())
                   if k.lower() not in _DROPPED and k.lower() not in names]
        headers += [(b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()), *fresh]
        await self._client({**self._start, "headers": headers})
        await self._client({"type": "http.response.body", "body": body, "more_body": False})


class Gathered:
    """The one answer object a chat (or completions) stream makes, folded event by event."""

    __slots__ = ("answer", "choices", "failed", "kind", "size")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.answer: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.failed = False  # the stream ended with an error event
        self.size = 0  # characters of text kept; past MAX_GATHERED_TEXT, none is

    def feed(self, lines: list[bytes]) -> None:
        """Whole lines of the stream (`data:` lines are its events; the rest is framing)."""
        for line in lines:
            if self.failed or self.size > MAX_GATHERED_TEXT or not line.startswith(b"data:"):
                continue
            chunk = json_object(line[5:].strip())
            if chunk is None:
                continue
            if "error" in chunk:
                self.failed = True
                continue
            for key, value in chunk.items():
                if key != "choices" and (key not in self.answer
                                         or key not in ("id", "created", "model")):
                    self.answer[key] = value
            for choice in chunk.get("choices") or ():
                if isinstance(choice, dict):
                    index = choice.get("index", 0)
                    at = index if isinstance(index, int) else 0
                    self.size += _add(self.choices.setdefault(at, {}), choice, self.kind)
                    if self.size > MAX_GATHERED_TEXT:
                        self.choices.clear()  # what was kept goes: the answer is an error

    def result(self) -> dict[str, Any] | None:
        """The answer; None when the stream ended with an error event or had no chunk."""
        if self.failed or not self.answer:
            return None
        answer = self.answer
        answer["object"] = "text_completion" if self.kind == "completions" else "chat.completion"
        answer["choices"] = [_choice(i, parts, self.kind)
                             for i, parts in sorted(self.choices.items())]
        return answer


def _add(parts: dict[str, Any], choice: dict[str, Any], kind: str) -> int:
    """One chunk's choice, added to what the choice gathered so far (text as a list of
    pieces, joined once at the end); how many characters of text it added."""
    if choice.get("finish_reason") is not None:
        parts["finish_reason"] = choice["finish_reason"]
    delta = choice if kind == "completions" else choice.get("delta")
    if not isinstance(delta, dict):
        return 0
    added = 0
    for name in ("content", "reasoning_content", "text", "refusal"):
        piece = delta.get(name)
        if isinstance(piece, str):
            parts.setdefault(name, []).append(piece)
            added += len(piece)
    for call in delta.get("tool_calls") or ():
        if isinstance(call, dict):
            calls = parts.setdefault("tool_calls", {})
            index = call.get("index", 0)
            into = calls.setdefault(index if isinstance(index, int) else 0,
                                    {"function": {"arguments": ""}})
            for key in ("id", "type"):
                if key in call:
                    into[key] = call[key]
            function = call.get("function")
            if not isinstance(function, dict):
                continue
            if "name" in function:
                into["function"]["name"] = function["name"]
            arguments = function.get("arguments")
            if isinstance(arguments, str):
                into["function"]["arguments"] += arguments
                added += len(arguments)
    return added


def _text(parts: dict[str, Any], name: str) -> str | None:
    pieces = parts.get(name)
    return None if pieces is None else "".join(pieces)


def _choice(index: int, parts: dict[str, Any], kind: str) -> dict[str, Any]:
    finish = parts.get("finish_reason")
    if kind == "completions":
        return {"index": index, "text": _text(parts, "text") or "", "logprobs": None,
                "finish_reason": finish}
    message: dict[str, Any] = {"role": "assistant", "content": _text(parts, "content")}
    for name in ("reasoning_content", "refusal"):
        if name in parts:
            message[name] = _text(parts, name)
    if "tool_calls" in parts:
        message["tool_calls"] = [parts["tool_calls"][i] for i in sorted(parts["tool_calls"])]
    return {"index": index, "message": message, "logprobs": None, "finish_reason": finish}
