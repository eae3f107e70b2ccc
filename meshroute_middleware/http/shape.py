"""A request body's shape, bounded before it is parsed (issue 32): how many JSON values, how
deep, how many messages and content parts.

Parsing, the depth check, translation and prefix hashing all grow with the number of values in
a body, not with its bytes: 13.7 MiB of 480k tiny messages took 0.3 s to parse and 3.2 s to
read as a chat request, holding the event loop (and the GIL: a worker thread does not help a
C parser). So a body of at most INLINE_BYTES is read at once on the loop (it cannot hold many
values); a larger one is read in a worker thread, after `check_large` (http/request.py): when
byte counts cannot rule it out, a scan of its tokens in Python refuses too many values before
anything parses the body. The scan hands the GIL back every YIELD_TOKENS tokens: a thread
left to the interpreter's switch interval holds it 5 ms each time the loop's thread gives it
up for a syscall, and a loaded machine made that 510 ms for one `/healthz`;
then the parsed body's messages and parts are counted, and its depth is scanned as every
body's is (`load_object`). Each refusal is a 413 (400 for the depth) with its own code."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from meshroute_middleware.http.errors import HttpError

# Deeper JSON is refused before anything is forwarded: our parser would recurse (the standard
# library past ~1,000 levels raises RecursionError) and a node's parser may break on less.
MAX_JSON_DEPTH = 128
# Defaults with ample headroom over what clients send: a long agent history is thousands of
# messages (each a few values, its text and images one string each); the bounds are 10x that.
DEFAULT_MAX_MESSAGES = 50_000  # `messages` (chat, Anthropic) or `input` items (Responses)
DEFAULT_MAX_CONTENT_PARTS = 100_000  # content parts over all messages
DEFAULT_MAX_JSON_VALUES = 500_000  # values and members outside strings
# A body of at most this many bytes is read on the event loop at once (it holds at most half
# as many values: reading it as a chat request takes a few ms, docs/benchmarks.md); a larger
# one in a worker thread, after `check_large`.
INLINE_BYTES = 32 * 1024
# Up to the next comma or bracket outside a string (strings consumed whole, escapes included);
# group 1 is that comma or bracket.
_NEXT = re.compile(rb'(?:"[^"\\]*(?:\\.[^"\\]*)*"|[^"\[\]{},])*([\[\]{},])', re.DOTALL)
_OPEN, _CLOSE = frozenset(b"[{"), frozenset(b"]}")
COUNT_STEP = 1024 * 1024  # bytes counted per call by value_bound
YIELD_TOKENS = 2048  # tokens `scan` reads between two hand-backs of the GIL (~0.5 ms)


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """The shape a request body may have (each limit a 413 past it; depth a 400)."""

    max_messages: int = DEFAULT_MAX_MESSAGES
    max_content_parts: int = DEFAULT_MAX_CONTENT_PARTS
    max_json_values: int = DEFAULT_MAX_JSON_VALUES
    max_depth: int = MAX_JSON_DEPTH

    def __post_init__(self) -> None:
        for name in ("max_messages", "max_content_parts", "max_json_values", "max_depth"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")

    def inline(self, body: bytes) -> bool:
        """Whether a body is read at once, on the event loop: it is small, and none of its
        counts can pass a limit (a body of n bytes holds fewer than n / 2 + 1 values)."""
        return len(body) <= min(INLINE_BYTES, 2 * (min(
            self.max_messages, self.max_content_parts, self.max_json_values) - 1))


def value_bound(body: bytes) -> int:
    """An upper bound on what `scan` counts, from byte counts alone (commas and brackets in
    strings counted too), a MiB at a time: a worker thread holds the GIL a few ms at most."""
    found = 1
    for start in range(0, len(body), COUNT_STEP):
        end = start + COUNT_STEP
        found += (body.count(b",", start, end) + body.count(b"{", start, end)
                  + body.count(b"[", start, end))
        time.sleep(0)  # the GIL handed back to the event loop's thread between steps
    return found


def scan(body: bytes, max_depth: int, max_values: int | None = None) -> None:
    """RequestError when the body nests deeper than `max_depth` (400 `invalid_json`) or holds
    more than `max_values` values and members (413 `too_many_values`), linear in the bytes; it
    stops at the first limit passed. Values are counted as 1, and 1 per comma and per opening
    bracket outside strings (each value is the root, the first in its container or after a
    comma: at least as many as there are). Invalid JSON is left to the parser."""
    values, depth, tokens = 1, 0, 0
    for match in _NEXT.finditer(body):
        tokens += 1
        if tokens == YIELD_TOKENS:  # the event loop's thread takes the GIL now, not later
            tokens = 0
            time.sleep(0)
        token = body[match.start(1)]
        if token in _OPEN:
            values += 1
            depth += 1
            if depth > max_depth:
                raise HttpError.INVALID_JSON.error(
                    f"request body nests deeper than {max_depth} levels")
        elif token in _CLOSE:
            depth -= 1
        else:
            values += 1
        if max_values is not None and values > max_values:
            raise HttpError.TOO_MANY_VALUES.error(
                f"request body holds more than {max_values} JSON values")


def check_messages(payload: dict[str, Any], limits: BodyLimits) -> None:
    """RequestError(413) when `messages` (or a list `input`) holds more than `max_messages`
    items (`too_many_messages`) or they hold more than `max_content_parts` content parts in
    all (`too_many_content_parts`)."""
    for name in ("messages", "input"):
        items = payload.get(name)
        if not isinstance(items, list):
            continue
        if len(items) > limits.max_messages:
            raise HttpError.TOO_MANY_MESSAGES.error(
                f"'{name}' holds {len(items)} items, more than the limit "
                f"of {limits.max_messages}", param=name)
        parts = sum(len(item["content"]) for item in items
                    if isinstance(item, dict) and isinstance(item.get("content"), list))
        if parts > limits.max_content_parts:
            raise HttpError.TOO_MANY_CONTENT_PARTS.error(
                f"'{name}' holds {parts} content parts, more than the "
                f"limit of {limits.max_content_parts}", param=name)
