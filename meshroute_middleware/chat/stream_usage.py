"""Every streamed chat answer reports its usage, and the client's stream stays as it asked
(issue 32).

A streamed chat request that does not ask for usage is sent upstream (provider, mesh node or
the app behind the middleware) with `stream_options.include_usage = true`: OpenAI-compatible
servers then end the stream with a usage-only chunk (`"choices": []`), which the meter reads
(chat/spend.py), so a budget is settled with the upstream's own count instead of an estimate.
Its answer passes through `UsageStrip` on the way to the client: the usage-only chunk (and the
blank line that ends its event) is dropped, and the `"usage": null` the other chunks then
carry is taken out, so the client receives what it would have without the gateway's ask.
A client that asked for usage gets it as sent.
"""

from __future__ import annotations

import re

import orjson
from starlette.types import Message, Send

from meshroute_middleware.chat.headers import is_sse
from meshroute_middleware.http.request import loads

ASK = b'"stream_options":{"include_usage":true},'
_USAGE = b'"usage"'
_OPENAI_NULL = b',"usage":null'
# A usage-only chunk: `"choices": []`. Inside a JSON string a quote is escaped, so these
# byte patterns only match the chunk's own keys.
_NO_CHOICES = re.compile(rb'"choices"\s*:\s*\[\s*\]')
_NULL_USAGE = re.compile(rb',\s*"usage"\s*:\s*null(?=\s*[,}])|"usage"\s*:\s*null\s*,?')


def with_usage(body: bytes) -> bytes:
    """`body` (a JSON object) asking for streamed usage: the field written in front of the
    others (no parse), or, when the body has `stream_options` of its own, set in it."""
    if b'"stream_options"' not in body:
        start = body.index(b"{") + 1  # a parsed chat request: an object with a model
        return body[:start] + ASK + body[start:]
    payload = loads(body)
    options = payload.get("stream_options")
    payload["stream_options"] = {**(options if isinstance(options, dict) else {}),
                                 "include_usage": True}
    return orjson.dumps(payload)


class UsageStrip:
    """The `send` of a request whose streamed usage the gateway asked for, not the client:
    passes the answer on without the usage the client did not ask for. Holds back at most an
    unfinished line of a chunk (until its newline comes), nothing of a non-SSE answer."""

    __slots__ = ("_rest", "_send", "_skip_blank", "_sse", "dropped")

    def __init__(self, send: Send) -> None:
        self._send = send
        self._sse = False
        self._rest = b""
        self._skip_blank = False
        self.dropped = 0  # usage-only chunks taken out (tests, logs)

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            headers = message.get("headers", ())
            self._sse = is_sse(headers)
            if self._sse and any(k == b"content-length" for k, _ in headers):
                # what is taken out shortens the stream: its length is the server's to frame
                message = {**message, "headers": [(k, v) for k, v in headers
                                                  if k != b"content-length"]}
        elif kind == "http.response.body" and self._sse:
            body = message.get("body", b"")
            out = self._filter(body, final=not message.get("more_body", False))
            if out is not body:
                message = {**message, "body": out}
        await self._send(message)

    def _filter(self, body: bytes, final: bool) -> bytes:
        data = self._rest + body if self._rest else body
        cut = len(data) if final else data.rfind(b"\n") + 1
        if cut < len(data):  # an unfinished line waits for its end
            data, self._rest = data[:cut], data[cut:]
        else:
            self._rest = b""
        if _USAGE in data:  # no JSON string holds these bytes: a quote in one is escaped
            data = data.replace(_OPENAI_NULL, b"")  # OpenAI's own spelling, at C speed
            if _USAGE in data:
                data = _NULL_USAGE.sub(b"", data)
        if _USAGE not in data and not self._skip_blank:  # the usual chunk: as it came
            return data
        return b"".join(self._line(line) for line in data.splitlines(keepends=True))

    def _line(self, line: bytes) -> bytes:
        if self._skip_blank:
            self._skip_blank = False
            if not line.strip():
                return b""
        if not line.startswith(b"data:") or _USAGE not in line:
            return line
        if _NO_CHOICES.search(line):
            self.dropped += 1
            self._skip_blank = True  # the blank line that ends the dropped event
            return b""
        return line
