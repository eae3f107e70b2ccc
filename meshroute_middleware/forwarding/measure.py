"""Counting completion tokens in a response as it passes, without holding a byte back.

A JSON body carries `usage.completion_tokens`; an SSE stream may end with a usage chunk, and
otherwise every `data:` event whose delta carries non-empty content, tool-call arguments or
reasoning (`reasoning_content`, `reasoning`) counts as one token (OpenAI-compatible servers
send one chunk per token). Anthropic's Messages answers (a route with `api = "anthropic"`)
count the same way: `usage.output_tokens` (a stream's last `message_delta` carries the
total), else one per `text_delta` / `input_json_delta` / `thinking_delta` event.
`usage.prompt_tokens` (Anthropic: `input_tokens`) is read from the same places (None when the
upstream sent none), and the cached part of the prompt (issue 35): OpenAI's
`prompt_tokens_details.cached_tokens` (included in `prompt_tokens`), Anthropic's
`cache_read_input_tokens` and `cache_creation_input_tokens` (not included in its
`input_tokens`: the prompt is their sum, the same meaning on every API).
A completions stream carries its tokens as `choices[].text`: its meter looks for non-empty
`"text"` instead, picked once per meter, so chat's scan is the same one regex as before.
"""

from __future__ import annotations

import re

from meshroute_middleware.core.contracts.error_body import sse_error_event

__all__ = ["TokenMeter", "sse_error_event"]

_COMPLETION_TOKENS = re.compile(rb'"(?:completion|output)_tokens"\s*:\s*(\d+)')
_PROMPT_TOKENS = re.compile(rb'"(?:prompt|input)_tokens"\s*:\s*(\d+)')
_CACHED = re.compile(rb'"cached_tokens"\s*:\s*(\d+)')  # OpenAI's, part of prompt_tokens
_CACHE_READ = re.compile(rb'"cache_read_input_tokens"\s*:\s*(\d+)')  # Anthropic's, beside
_CACHE_WRITE = re.compile(rb'"cache_creation_input_tokens"\s*:\s*(\d+)')  # input_tokens
_NONEMPTY_CONTENT = re.compile(rb'"(?:content|arguments|reasoning_content|reasoning)"\s*:\s*"(?!")'
                               rb'|"type"\s*:\s*"(?:text|input_json|thinking)_delta"')
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
        self.usage_prompt_tokens: int | None = None  # a stream's usage chunk's prompt_tokens
        # a stream's cached counts as last sent (None: never) and whether its prompt count
        # was OpenAI's `prompt_tokens` (cache reads and writes included)
        self._cached: int | None = None
        self._cache_read: int | None = None
        self._cache_write: int | None = None
        self._openai_prompt = False
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
            match = _PROMPT_TOKENS.search(line)
            if match:
                self.usage_prompt_tokens = _count(match.group(1))
                self._openai_prompt = match.group(0).startswith(b'"prompt')
            if b"cache" in line:
                self._cached_of(line)
        if self._token.search(line):
            self.chunks_counted += 1

    @property
    def completion_tokens(self) -> int:
        """Tokens from `usage` when the upstream sent it, else the counted chunks."""
        if self.streaming:
            self._flush()
            return self.usage_tokens if self.usage_tokens is not None else self.chunks_counted
        found = self._last((b'"completion_tokens"', b'"output_tokens"'), _COMPLETION_TOKENS)
        return 0 if found is None else found

    def _cached_of(self, line: bytes) -> None:
        for pattern, name in ((_CACHED, "_cached"), (_CACHE_READ, "_cache_read"),
                              (_CACHE_WRITE, "_cache_write")):
            match = pattern.search(line)
            if match:
                setattr(self, name, _count(match.group(1)))

    @property
    def prompt_tokens(self) -> int | None:
        """The prompt's tokens as the upstream counted them (cache reads and writes
        included: Anthropic's `input_tokens` leaves them out, so they are added), else None."""
        if self.streaming:
            self._flush()
            prompt, openai = self.usage_prompt_tokens, self._openai_prompt
        else:
            prompt = self._last((b'"prompt_tokens"',), _PROMPT_TOKENS)
            openai = prompt is not None
            if prompt is None:
                prompt = self._last((b'"input_tokens"',), _PROMPT_TOKENS)
        if prompt is None or openai:
            return prompt
        read, write = self._anthropic_cache()
        return prompt + read + write

    @property
    def cached_tokens(self) -> int:
        """The prompt's tokens read from the provider's cache (0: none reported)."""
        read = self._cache_read if self.streaming else self._last(
            (b'"cache_read_input_tokens"',), _CACHE_READ)
        if read is not None:
            return read
        cached = self._cached if self.streaming else self._last((b'"cached_tokens"',), _CACHED)
        return cached or 0

    @property
    def cache_write_tokens(self) -> int:
        """The prompt's tokens written to the provider's cache (0: none reported)."""
        return self._anthropic_cache()[1]

    def counts(self) -> tuple[int | None, int, int, int]:
        """(prompt_tokens, completion_tokens, cached_tokens, cache_write_tokens) at once: a
        JSON body's tail is copied once, and looked through for cache counts only when it
        names one."""
        if self.streaming:
            return (self.prompt_tokens, self.completion_tokens, self.cached_tokens,
                    self.cache_write_tokens)
        tail = bytes(self._tail[-_MAX_JSON_TAIL:])
        completion = self._last((b'"completion_tokens"', b'"output_tokens"'),
                                _COMPLETION_TOKENS, tail)
        prompt = self._last((b'"prompt_tokens"',), _PROMPT_TOKENS, tail)
        openai = prompt is not None
        if prompt is None:
            prompt = self._last((b'"input_tokens"',), _PROMPT_TOKENS, tail)
        if b"cache" not in tail:
            return prompt, completion or 0, 0, 0
        read = self._last((b'"cache_read_input_tokens"',), _CACHE_READ, tail)
        write = self._last((b'"cache_creation_input_tokens"',), _CACHE_WRITE, tail) or 0
        if prompt is not None and not openai:
            prompt += (read or 0) + write
        cached = read if read is not None else self._last((b'"cached_tokens"',), _CACHED,
                                                          tail) or 0
        return prompt, completion or 0, cached, write

    def _anthropic_cache(self) -> tuple[int, int]:
        if self.streaming:
            self._flush()
            return self._cache_read or 0, self._cache_write or 0
        return (self._last((b'"cache_read_input_tokens"',), _CACHE_READ) or 0,
                self._last((b'"cache_creation_input_tokens"',), _CACHE_WRITE) or 0)

    def _flush(self) -> None:
        """A stream's last line, ended without a newline, counts too."""
        if self._parts:
            self._line_done(b"".join(self._parts))
            self._parts.clear()
            self._pending = 0

    def _last(self, names: tuple[bytes, ...], pattern: re.Pattern[bytes],
              tail: bytes | None = None) -> int | None:
        """A JSON body's last count under the first of `names` it holds (usage closes the
        body), else None."""
        if tail is None:
            tail = bytes(self._tail[-_MAX_JSON_TAIL:])
        for name in names:
            at = tail.rfind(name)
            while at >= 0:
                match = pattern.match(tail, at)
                if match:
                    return _count(match.group(1))
                at = tail.rfind(name, 0, at)
        return None
