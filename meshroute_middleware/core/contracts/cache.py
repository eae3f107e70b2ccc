"""The x-meshroute-cache response header: whether the head node found the prompt's prefix
in its prefix cache (issue 26), e.g. `warm; cached=3900; prompt=4210`.

Written by the emulated node (`meshroute node --emulate` with `--cache-tokens`), passed on
by the gateway, read by `meshroute demo`. `warm`: at least half the prompt was cached (as
`bench learning` counts a warm turn); `partial`: some of it; `cold`: none.
"""

from __future__ import annotations

import re
from typing import Final, NamedTuple

CACHE_HEADER: Final = "x-meshroute-cache"
WARM_SHARE: Final = 0.5
MAX_HEADER_CHARS: Final = 96
_VALUE_RE = re.compile(r"^(warm|partial|cold); cached=([0-9]{1,9}); prompt=([0-9]{1,9})\Z")


class CacheNote(NamedTuple):
    """What a node says of one request's prompt: its state, tokens cached and in all."""

    state: str
    cached_tokens: int
    prompt_tokens: int


def cache_note(cached_tokens: int, prompt_tokens: int) -> CacheNote:
    """The state of a prompt of which `cached_tokens` were in the cache."""
    cached = min(max(cached_tokens, 0), max(prompt_tokens, 0))
    if cached <= 0:
        state = "cold"
    elif cached >= WARM_SHARE * prompt_tokens:
        state = "warm"
    else:
        state = "partial"
    return CacheNote(state, cached, max(prompt_tokens, 0))


def encode_cache(note: CacheNote) -> str:
    """The header value."""
    return f"{note.state}; cached={note.cached_tokens}; prompt={note.prompt_tokens}"


def parse_cache(value: str | None) -> CacheNote | None:
    """The header value as a CacheNote; None if absent or not of this shape (never raises:
    it comes from another process and only feeds a display)."""
    if value is None or len(value) > MAX_HEADER_CHARS:
        return None
    match = _VALUE_RE.match(value.strip())
    if match is None:
        return None
    cached, prompt = int(match.group(2)), int(match.group(3))
    if cached > prompt:
        return None
    return CacheNote(match.group(1), cached, prompt)
