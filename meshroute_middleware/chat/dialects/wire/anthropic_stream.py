"""An OpenAI chat-completions SSE stream as a Messages stream, translated chunk by chunk.

Events, in Anthropic's order: `message_start`, `ping`, then per content block
`content_block_start`, `content_block_delta` (`text_delta` / `input_json_delta`) and
`content_block_stop`, then `message_delta` (stop_reason, usage) and `message_stop`. An OpenAI
error event (a stream that broke mid-way) becomes an `error` event. The work is linear in the
bytes fed and only the unfinished line is held (a line split across chunks is joined once).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

from meshroute_middleware.chat.dialects.wire.anthropic import (
    Asked,
    sse,
    stop_reason,
    stream_failed,
    tool_use_block,
    usage,
)

MAX_LINE_BYTES = 8 * 1024 * 1024  # a longer SSE line is not a chunk we can read: skipped


class SseLines:
    """Bytes in, complete lines out; a pending line is kept in parts, joined when it ends."""

    __slots__ = ("_parts", "_size")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._size = 0

    def feed(self, chunk: bytes) -> Iterator[bytes]:
        start = 0
        end = chunk.find(b"\n")
        while end >= 0:
            self._take(chunk[start:end])
            if self._size <= MAX_LINE_BYTES:
                yield b"".join(self._parts)
            self._parts.clear()
            self._size = 0
            start = end + 1
            end = chunk.find(b"\n", start)
        self._take(chunk[start:])

    def rest(self) -> bytes:
        """The unfinished last line (a stream may end without a newline)."""
        line = b"".join(self._parts) if self._size <= MAX_LINE_BYTES else b""
        self._parts.clear()
        self._size = 0
        return line

    def _take(self, piece: bytes) -> None:
        if not piece or self._size > MAX_LINE_BYTES:
            return
        self._size += len(piece)
        if self._size > MAX_LINE_BYTES:
            self._parts.clear()
        else:
            self._parts.append(piece)


class MessageStream:
    """Feed it the chat stream's body chunks; it returns the Messages events for each."""

    def __init__(self, asked: Asked, message_id: str, input_tokens: int = 0) -> None:
        self.asked, self.message_id, self.input_tokens = asked, message_id, input_tokens
        self._lines = SseLines()
        self._started = False
        self._done = False
        self._blocks = 0  # content blocks opened so far
        self._open: str | None = None  # "text" or "tool:<openai index>" while a block is open
        self._tools: dict[int, int] = {}  # OpenAI tool call index -> block index
        self._choice: dict[str, Any] = {}  # finish_reason (and vLLM's stop_reason) seen
        self._usage: object = None
        self._deltas = 0  # content deltas: the output tokens when no usage comes

    @property
    def done(self) -> bool:
        return self._done

    def feed(self, chunk: bytes) -> bytes:
        """The events for one body chunk (empty while its lines are unfinished)."""
        return b"".join(self._line(line) for line in self._lines.feed(chunk))

    def close(self) -> bytes:
        """The events that end the stream: its last line's, then the closing ones (or an
        error event when the stream stopped before its answer was complete)."""
        out = self._line(self._lines.rest())
        if self._done:
            return out
        if self._choice.get("finish_reason") is not None:
            return out + self._finish()
        self._done = True
        return out + stream_failed("the route's stream ended before its answer was complete")

    def _line(self, line: bytes) -> bytes:
        if self._done or not line.startswith(b"data:"):
            return b""
        data = line[5:].strip()
        if data == b"[DONE]":
            return self._finish()
        try:
            chunk = json.loads(data)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return b""  # not a chunk: skipped, as an SSE client would
        if not isinstance(chunk, Mapping):
            return b""
        if "error" in chunk and not chunk.get("choices"):
            return self._error(chunk["error"])
        return self._chunk(chunk)

    def _start(self) -> bytes:
        self._started = True
        return sse("message_start", {"type": "message_start", "message": {
            "id": self.message_id, "type": "message", "role": "assistant",
            "model": self.asked.model, "content": [], "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": self.input_tokens, "output_tokens": 0}}}) + sse(
            "ping", {"type": "ping"})

    def _chunk(self, chunk: Mapping[str, Any]) -> bytes:
        out = b"" if self._started else self._start()
        if isinstance(chunk.get("usage"), Mapping):
            self._usage = chunk["usage"]
        choices = chunk.get("choices")
        choice = choices[0] if isinstance(choices, list) and choices else None
        if not isinstance(choice, Mapping):
            return out
        delta = choice.get("delta")
        if isinstance(delta, Mapping):
            text = delta.get("content")
            if isinstance(text, str) and text:
                out += self._text(text)
            calls = delta.get("tool_calls")
            for call in calls if isinstance(calls, list) else ():
                out += self._tool(call)
        if choice.get("finish_reason") is not None:
            self._choice = dict(choice)
        return out

    def _text(self, text: str) -> bytes:
        out = b""
        if self._open != "text":
            out = self._open_block("text", {"type": "text", "text": ""})
        self._deltas += 1
        return out + self._delta({"type": "text_delta", "text": text})

    def _tool(self, call: object) -> bytes:
        if not isinstance(call, Mapping):
            return b""
        index = call.get("index", 0)
        index = index if isinstance(index, int) else 0
        out = b""
        if index not in self._tools:
            block = tool_use_block(call, f"{self.message_id}_{index}", parse=False)
            out = self._open_block(f"tool:{index}", block)
            self._tools[index] = self._blocks - 1
        function = call.get("function")
        arguments = function.get("arguments") if isinstance(function, Mapping) else None
        if isinstance(arguments, str) and arguments:
            self._deltas += 1
            out += self._delta({"type": "input_json_delta", "partial_json": arguments},
                               self._tools[index])
        return out

    def _open_block(self, kind: str, block: Mapping[str, Any]) -> bytes:
        out = self._close_block()
        self._open = kind
        self._blocks += 1
        return out + sse("content_block_start", {"type": "content_block_start",
                                                 "index": self._blocks - 1,
                                                 "content_block": block})

    def _delta(self, delta: Mapping[str, Any], index: int | None = None) -> bytes:
        at = self._blocks - 1 if index is None else index
        return sse("content_block_delta", {"type": "content_block_delta", "index": at,
                                           "delta": delta})

    def _close_block(self) -> bytes:
        if self._open is None:
            return b""
        self._open = None
        return sse("content_block_stop", {"type": "content_block_stop",
                                          "index": self._blocks - 1})

    def _finish(self) -> bytes:
        out = (b"" if self._started else self._start()) + self._close_block()
        self._done = True
        reason, sequence = stop_reason(self._choice, self.asked)
        if self._tools:
            reason, sequence = "tool_use", None
        counted = usage(self._usage, self.input_tokens, self._deltas)
        return out + sse("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": counted}) + sse("message_stop", {"type": "message_stop"})

    def _error(self, error: object) -> bytes:
        self._done = True
        message = error.get("message") if isinstance(error, Mapping) else None
        return stream_failed(message if isinstance(message, str) else
                             "the route failed mid-stream")
