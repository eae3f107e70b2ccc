"""Counting completion tokens in a response as it passes, without holding a byte back.

A JSON body carries `usage.completion_tokens`; an SSE stream may end with a usage chunk, and
otherwise every `data:` event whose delta carries non-empty content counts as one token
(OpenAI-compatible servers send one chunk per token). A completions stream carries its tokens
as `choices[].text`: its meter looks for non-empty `"text"` instead, picked once per meter, so
chat's scan is the same one regex as before.
"""

from __future__ import annotations

import re

from meshroute_middleware.core.contracts.error_body import sse_error_event

__all__ = ["TokenMeter", "sse_error_event"]

_COMPLETION_TOKENS = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
_NONEMPTY_CONTENT = re.compile(rb'"content"\s*:\s*"(?!")')
_NONEMPTY_TEXT = re.compile(rb'"text"\s*:\s*"(?!")')  # completions' choices[].text
_MAX_JSON_TAIL = 64 * 1024  # a non-stream body is scanned in its last 64 KiB for usage
_MAX_LINE = 1024 * 1024  # a longer SSE line is not ours to parse; drop it rather than grow
_NO_PARTS: list[bytes] = []  # shared, never appended to: a JSON meter keeps no line
_NO_TAIL = bytearray()  # shared, never appended to: a stream meter keeps no tail
_MAX_DIGITS = 18  # a longer count is a lie: read as 10**18 (clamped later), never int()-ed


def _count(digits: bytes) -> int:
    """A count as sent, without int()'s ValueError past 4,300 digits (or its cost)."""
    return int(digits) if len(digits) <= _MAX_DIGITS else 10 ** _MAX_DIGITS


class TokenMeter:
    """Feed it response chunks; it tells how many completion tokens went by."""

    def __init__(self, streaming: bool, *, text: bool = False) -> None:
        self.streaming = streaming
        self._token = _NONEMPTY_TEXT if text else _NONEMPTY_CONTENT  # what one token is
        self.chunks_counted = 0
        self.usage_tokens: int | None = None
        # a stream: the pending (unfinished) SSE line, as it came, and its length (past
        # _MAX_LINE the rest of the line is skipped); a JSON body: its tail
        self._parts: list[bytes] = [] if streaming else _NO_PARTS
        self._pending = 0
        self._tail = _NO_TAIL if streaming else bytearray()

    def feed(self, chunk: bytes) -> None:
        """Account for one body chunk; the work is linear in the bytes fed, however they
        are split (a pending line is joined once, when its newline arrives)."""
        if not self.streaming:
            self._tail += chunk
            if len(self._tail) > 2 * _MAX_JSON_TAIL:  # trimmed now and then, not per chunk
                del self._tail[:-_MAX_JSON_TAIL]
            return
        start = 0
        end = chunk.find(b"\n")
        while end >= 0:
            self._take(chunk, start, end)
            self._line_done(b"".join(self._parts))
            self._parts.clear()
            self._pending = 0
            start = end + 1
            end = chunk.find(b"\n", start)
        self._take(chunk, start, len(chunk))

    def _take(self, chunk: bytes, start: int, end: int) -> None:
        """Keep chunk[start:end] as part of the pending line, unless it grew too long."""
        if start == end or self._pending > _MAX_LINE:
            return
        self._pending += end - start
        if self._pending > _MAX_LINE:  # not ours to parse: dropped, the rest of it skipped
            self._parts.clear()
            return
        self._parts.append(chunk[start:end] if start or end < len(chunk) else chunk)

    def _line_done(self, line: bytes) -> None:
        if not line.startswith(b"data:"):
            return
        if b'"usage"' in line:
            match = _COMPLETION_TOKENS.search(line)
            if match:
                self.usage_tokens = _count(match.group(1))
        if self._token.search(line):
            self.chunks_counted += 1

    @property
    def completion_tokens(self) -> int:
        """Tokens from `usage` when the upstream sent it, else the counted chunks."""
        if self.streaming:
            if self._parts:
                self._line_done(b"".join(self._parts))
                self._parts.clear()
                self._pending = 0
            return self.usage_tokens if self.usage_tokens is not None else self.chunks_counted
        tail = bytes(self._tail[-_MAX_JSON_TAIL:])
        at = tail.rfind(b'"completion_tokens"')  # the last one: usage closes the body
        while at >= 0:
            match = _COMPLETION_TOKENS.match(tail, at)
            if match:
                return _count(match.group(1))
            at = tail.rfind(b'"completion_tokens"', 0, at)
        return 0
