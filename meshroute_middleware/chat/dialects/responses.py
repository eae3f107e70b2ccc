"""`POST /v1/responses` (OpenAI Responses, the stateless subset) over the one chat path.

The request becomes a chat-completions request (chat.dialects.wire.responses_request); the chat
path's 200 answers become Responses answers on their way to the client: a JSON completion a
`response` object, an SSE stream the Responses events, translated as each chunk passes (a
split line is joined when its end arrives; nothing is held back), and the SSE error event
that ends a broken stream an `error` and a `response.failed` event. Every other answer (the
chat path's errors, in OpenAI's shape, which the Responses API shares) passes untouched.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.types import Message, Send

from meshroute_middleware.chat.dialects.wire.responses_answer import (
    MAX_KEPT_CHARS,
    ResponsesAnswerError,
    ResponsesStream,
    completion_events,
    encode_events,
    from_completion,
)
from meshroute_middleware.chat.dialects.wire.responses_request import (
    Echo,
    ResponsesRequestError,
    to_chat,
)
from meshroute_middleware.chat.headers import is_sse
from meshroute_middleware.chat.scrub import DECODABLE, content_encoding
from meshroute_middleware.endpoints import RESPONSES_PATH
from meshroute_middleware.http.errors import HttpError, RequestError
from meshroute_middleware.http.request import load_object

MAX_ANSWER_BYTES = 64 * 1024 * 1024  # a JSON answer held to be translated, at most
MAX_EVENT_BYTES = 16 * 1024 * 1024  # one SSE event of a chat stream, at most (else dropped)
# The headers of a translated answer that no longer hold: its length and coding change.
_STALE = frozenset({b"content-length", b"content-encoding"})
log = logging.getLogger("meshroute.responses")


@dataclass(slots=True)
class ResponsesDialect:
    """The Responses API at `path`; `clock` stamps `created_at`."""

    path: str = RESPONSES_PATH
    clock: Callable[[], float] = field(default=time.time)

    def open(self, send: Send) -> ResponsesTranslation:
        """Start translating one request whose answer goes to `send`."""
        return ResponsesTranslation(send, f"resp_{secrets.token_hex(16)}",
                                    int(self.clock()))


class SSELines:
    """An SSE byte stream in, the `data` of each complete event out, however it is split:
    linear in the bytes fed (a pending line is joined once, when its end arrives)."""

    __slots__ = ("_data", "_parts", "_pending")

    def __init__(self) -> None:
        self._parts: list[bytes] = []  # the unfinished line
        self._pending = 0  # its length; past MAX_EVENT_BYTES the line is dropped
        self._data: list[bytes] = []  # the `data:` lines of the event under way

    def feed(self, chunk: bytes) -> list[bytes]:
        """The data of every event this chunk completes."""
        out: list[bytes] = []
        start, end = 0, chunk.find(b"\n")
        while end >= 0:
            self._take(chunk[start:end])
            self._line(b"".join(self._parts).rstrip(b"\r"), out)
            self._parts.clear()
            self._pending = 0
            start = end + 1
            end = chunk.find(b"\n", start)
        self._take(chunk[start:])
        return out

    def close(self) -> list[bytes]:
        """The data of an event the stream ended in without a blank line."""
        out: list[bytes] = []
        if self._parts:
            self._line(b"".join(self._parts).rstrip(b"\r"), out)
            self._parts.clear()
        self._line(b"", out)
        return out

    def _take(self, piece: bytes) -> None:
        if piece and self._pending <= MAX_EVENT_BYTES:
            self._pending += len(piece)
            self._parts.append(piece)

    def _line(self, line: bytes, out: list[bytes]) -> None:
        if self._pending > MAX_EVENT_BYTES:
            return  # not a chat chunk any route sends: skipped, never grown without bound
        if not line:
            if self._data:
                out.append(b"\n".join(self._data))
                self._data = []
        elif line.startswith(b"data:"):
            self._data.append(line[5:].removeprefix(b" "))


class ResponsesTranslation:
    """One Responses request: its chat body, then its answer translated into `send`."""

    __slots__ = ("_client", "_decoder", "_echo", "_held", "_held_bytes", "_lines", "_mode",
                 "_stream", "created_at", "response_id", "send")

    def __init__(self, send: Send, response_id: str, created_at: int) -> None:
        self._client = send
        self.send: Send = self._translate  # the client's send, as the chat path sees it
        self.response_id, self.created_at = response_id, created_at
        self._echo: Echo | None = None  # set once the request is translated
        self._mode = "pass"  # pass | json | sse | drop: what the answer's body gets
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._lines = SSELines()
        self._stream: ResponsesStream | None = None
        self._decoder: Any = None  # a zlib decompressor, for an answer a route compressed

    def request(self, body: bytes) -> bytes:
        """The chat-completions body for a Responses body (RequestError 400 naming the field
        when it is not one meshroute serves)."""
        try:
            chat, self._echo = to_chat(load_object(body))
        except ResponsesRequestError as exc:
            raise RequestError(HttpError.INVALID_REQUEST.status, str(exc), exc.code,  # its own code
                               param=exc.param) from None
        return json.dumps(chat).encode()

    async def _translate(self, message: Message) -> None:
        """The chat path's answer, translated when it is a success."""
        kind = message["type"]
        if kind == "http.response.start":
            await self._start(message)
        elif kind != "http.response.body" or self._mode == "pass":
            await self._client(message)
        elif self._mode != "drop":
            body, more = message.get("body", b""), bool(message.get("more_body"))
            if self._decoder is not None:
                try:
                    body = self._decoder.decompress(body, MAX_ANSWER_BYTES)
                    bomb = bool(self._decoder.unconsumed_tail)
                except zlib.error:
                    bomb = True
                if bomb:
                    log.warning("meshroute: a route's compressed answer is corrupt or too "
                                "large: aborted")
                    self._mode = "drop"
                    return
            await (self._sse(body, more) if self._mode == "sse" else self._json(body, more))

    async def _start(self, message: Message) -> None:
        headers = message.get("headers", [])
        if self._echo is None or message["status"] != 200:
            self._mode = "pass"
            await self._client(message)
            return
        coding = content_encoding(headers)
        if coding:  # the forwarder asks for identity; a head may compress anyway
            if coding not in DECODABLE:
                self._mode = "drop"  # the chat path's body is not sent: this error is
                await HttpError.UPSTREAM_FAILED.send(
                    self._client, f"the route answered in the content "
                    f"coding {coding[:40]!r}, which meshroute does not read")
                return
            self._decoder = zlib.decompressobj(zlib.MAX_WBITS | 32 if coding != "deflate"
                                               else zlib.MAX_WBITS)
        self._mode = "sse" if is_sse(headers) else "json"
        kept = [(k, v) for k, v in headers if k.lower() not in _STALE]
        if self._mode == "json":  # a streamed request's JSON answer is sent as its events
            kept = [(k, v) for k, v in kept if k.lower() != b"content-type"]
            kept.append((b"content-type", b"text/event-stream" if self._echo.stream
                         else b"application/json"))
        await self._client({**message, "headers": kept})
        if self._mode == "sse":
            self._stream = ResponsesStream(self._echo, self.response_id, self.created_at)
            await self._body(encode_events(self._stream.start()), True)

    async def _body(self, body: bytes, more: bool) -> None:
        await self._client({"type": "http.response.body", "body": body, "more_body": more})

    async def _sse(self, chunk: bytes, more: bool) -> None:
        stream = self._stream
        assert stream is not None
        events: list[dict[str, Any]] = []
        datas = self._lines.feed(chunk) if chunk else []
        if not more:
            datas += self._lines.close()
        for data in datas:
            events += self._event(stream, data)
        if not more:
            events += stream.end()  # the stream ended without [DONE]: what came is all
            if stream.cut:
                log.warning("meshroute: a /v1/responses stream passed %d characters of text: "
                            "its closing events repeat only the first ones (its deltas carried "
                            "all of it)", MAX_KEPT_CHARS)
        if events or not more:
            await self._body(encode_events(events), more)

    def _event(self, stream: ResponsesStream, data: bytes) -> list[dict[str, Any]]:
        if data == b"[DONE]":
            return stream.end()
        try:
            chunk = json.loads(data)
        except ValueError:
            return []  # not a chat chunk: nothing a Responses client could read
        error = chunk.get("error") if isinstance(chunk, dict) else None
        if isinstance(error, dict):  # the chat path's SSE error event: the route broke
            return stream.fail(str(error.get("message", "the route failed mid-stream")),
                               error.get("code") if isinstance(error.get("code"), str)
                               else None)
        return stream.chunk(chunk)

    async def _json(self, chunk: bytes, more: bool) -> None:
        self._held_bytes += len(chunk)
        if self._held_bytes > MAX_ANSWER_BYTES:
            log.warning("meshroute: a route's /v1/responses answer passed %d bytes: aborted",
                        MAX_ANSWER_BYTES)
            self._mode, self._held = "drop", []
            return
        self._held.append(chunk)
        if more:
            return
        assert self._echo is not None
        try:
            completion = json.loads(b"".join(self._held))
            if self._echo.stream:
                body = encode_events(completion_events(completion, self._echo,
                                                       self.response_id, self.created_at))
            else:
                body = json.dumps(from_completion(completion, self._echo, self.response_id,
                                                  self.created_at)).encode()
        except (ValueError, ResponsesAnswerError) as exc:
            # The 200 is sent; a body that is no answer must not end like one: no final
            # chunk, so the server aborts the client's connection.
            log.warning("meshroute: a route's /v1/responses answer was unreadable (%s): "
                        "aborted", exc)
            self._mode, self._held = "drop", []
            return
        self._held = []
        await self._body(body, False)
