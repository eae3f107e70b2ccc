"""Provider keys out of every byte a client can see from a provider: headers, bodies, streams.

An upstream may echo the key it was given, verbatim or as it encodes text: JSON-escaped (`\\/`,
`\\u002f`, escaped twice inside a quoted JSON string), or URL-encoded (`%2F`, `%252F`). Each
character of a key is matched in any of these forms (hex in either case), and every match
becomes `***`. A stream is scrubbed as it passes: a chunk goes on at once, except a tail that
could be the start of a key, which waits for the next chunk (or the end). A compressed body is
decoded first, within a bound; one that cannot be decoded is not relayed.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

from meshroute_middleware.core.errors import MeshRouteError

REDACTED = b"***"
MAX_DECODED_BYTES = 32 * 1024 * 1024  # a decoded body past this is not relayed (gzip bombs)
DECODABLE = frozenset({"gzip", "x-gzip", "deflate"})


class UndecodableError(MeshRouteError, ValueError):
    """A body in an encoding we cannot read, corrupt, or larger than the bound once decoded."""


def _hex(byte: int) -> bytes:
    """A regex of the two hex digits of a byte, either case: `2[fF]`."""
    return b"".join(b"[" + d.encode() + d.upper().encode() + b"]" if d in "abcdef"
                    else d.encode() for d in f"{byte:02x}")


def _forms(char: str) -> tuple[bytes, bytes]:
    """One character of a key: (a regex of its complete forms, one of their proper prefixes).

    Keys are ASCII; a character beyond it is matched verbatim only."""
    raw = char.encode()
    if len(raw) > 1:
        return re.escape(raw), b"(?:" + b"|".join(re.escape(raw[:i])
                                                   for i in range(1, len(raw))) + b")"
    code = raw[0]
    full = [re.escape(raw),
            rb"\\+u00" + _hex(code),  # JSON: \u002f, any run of backslashes before it
            rb"%(?:25)*" + _hex(code)]  # URL: %2F, and encoded again: %252F
    if char in "/\"\\":
        full.append(rb"\\+" + re.escape(raw))  # JSON: \/ (and \\\/ inside a string)
    part = [rb"\\+", rb"\\+u", rb"\\+u0", rb"\\+u00", rb"%(?:25)*", rb"%(?:25)*2"]
    part += [rb"\\+u00" + _first_hex(code), rb"%(?:25)*" + _first_hex(code)]
    return b"(?:" + b"|".join(full) + b")", b"(?:" + b"|".join(part) + b")"


def _first_hex(byte: int) -> bytes:
    """A regex of the first hex digit of a byte, either case."""
    digit = f"{byte:02x}"[0]
    return b"[" + digit.encode() + digit.upper().encode() + b"]" if digit in "abcdef" \
        else digit.encode()


_END = ""  # a trie node's key: a secret ends here


def _trie(secrets: Iterable[str]) -> dict[str, Any]:
    root: dict[str, Any] = {}
    for secret in secrets:
        node = root
        for char in secret:
            node = node.setdefault(char, {})
        node[_END] = {}
    return root


def _whole(node: dict[str, Any]) -> bytes:
    """A regex of every secret below `node` in any form (longest first: `?` is greedy)."""
    alts = []
    for char, child in node.items():
        if char == _END:
            continue
        full = _forms(char)[0]
        below = [c for c in child if c != _END]
        if not below:
            alts.append(full)
        elif _END in child:
            alts.append(full + b"(?:" + _whole(child) + b")?")
        else:
            alts.append(full + _whole(child))
    return b"(?:" + b"|".join(alts) + b")"


def _prefix(node: dict[str, Any]) -> bytes:
    """A regex of a proper prefix of any secret below `node` (a partial key at a chunk's end)."""
    alts = []
    for char, child in node.items():
        if char == _END:
            continue
        full, part = _forms(char)
        alts.append(part)
        if any(c != _END for c in child):
            alts.append(full + b"(?:" + _prefix(child) + b")" + (b"" if _END in child
                                                                  else b"?"))
    return b"(?:" + b"|".join(alts) + b")"


class Scrubber:
    """Replaces every form of the given secrets with `***`; built once, used per answer."""

    def __init__(self, secrets: Iterable[str]) -> None:
        values = sorted({s for s in secrets if s}, key=len, reverse=True)
        self.secrets = tuple(values)
        trie = _trie(values)  # keys sharing a start (`sk-`) are matched along it once
        self._whole = re.compile(_whole(trie)) if values else None
        self._prefix = re.compile(_prefix(trie) + rb"\Z") if values else None
        # the longest complete form of a key: 7 bytes a character (`%2525` + hex) is plenty
        self.window = 8 * max((len(s.encode()) for s in values), default=0)

    def scrub(self, data: bytes) -> bytes:
        """`data` with every key in any form replaced."""
        if self._whole is None or not data:
            return data
        return self._whole.sub(REDACTED, data)

    def text(self, text: str) -> str:
        """`scrub` for a str (a log line, an error message)."""
        if self._whole is None:
            return text
        return self.scrub(text.encode("utf-8", "surrogateescape")).decode(
            "utf-8", "surrogateescape")

    def headers(self, headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """Response headers with every key scrubbed from names and values."""
        return [(self.scrub(k), self.scrub(v)) for k, v in headers]

    def held_from(self, data: bytes) -> int:
        """Where the tail that could begin a key starts in `data` (len(data): no such tail)."""
        if self._prefix is None or not data:
            return len(data)
        start = max(len(data) - self.window, 0)
        found = self._prefix.search(data, start)
        return found.start() if found is not None else len(data)

    def stream(self) -> StreamScrubber:
        """A scrubber for one stream's chunks, in order."""
        return StreamScrubber(self)


class StreamScrubber:
    """Scrubs a stream chunk by chunk; a key split across chunks is caught whole."""

    __slots__ = ("_held", "_scrubber")

    def __init__(self, scrubber: Scrubber) -> None:
        self._scrubber = scrubber
        self._held = b""

    def feed(self, chunk: bytes) -> bytes:
        """What may be sent of this chunk now: all of it, less a possible key's start."""
        data = self._scrubber.scrub(self._held + chunk) if (self._held or chunk) else b""
        cut = self._scrubber.held_from(data)
        self._held = data[cut:]
        return data[:cut]

    def flush(self) -> bytes:
        """The held tail, at the end of the stream (it was no key)."""
        held, self._held = self._held, b""
        return held


def content_encoding(headers: Iterable[tuple[bytes, bytes]]) -> str:
    """The response's content coding, lower-case ("" for none or identity)."""
    for k, v in headers:
        if k.lower() == b"content-encoding":
            coding = v.decode("latin-1").strip().lower()
            return "" if coding == "identity" else coding
    return ""


def _decompressor(coding: str) -> zlib._Decompress:
    if coding not in DECODABLE:
        raise UndecodableError(f"the content coding {coding[:40]!r} is not one meshroute reads")
    return zlib.decompressobj(zlib.MAX_WBITS | 32 if coding != "deflate" else zlib.MAX_WBITS)


def decode_body(headers: Iterable[tuple[bytes, bytes]], body: bytes,
                limit: int = MAX_DECODED_BYTES) -> bytes:
    """A whole body decoded from its content coding (gzip, deflate), at most `limit` bytes."""
    coding = content_encoding(headers)
    if not coding:
        return body
    decoder = _decompressor(coding)
    try:
        out = decoder.decompress(body, limit + 1)
    except zlib.error as exc:
        raise UndecodableError(f"the {coding} body is corrupt") from exc
    if len(out) > limit or decoder.unconsumed_tail:
        raise UndecodableError(f"the body decodes to more than {limit} bytes")
    if not decoder.eof:
        raise UndecodableError(f"the {coding} body is truncated")
    return out


async def decode_stream(headers: Iterable[tuple[bytes, bytes]], chunks: AsyncIterator[bytes],
                        limit: int = MAX_DECODED_BYTES) -> AsyncIterator[bytes]:
    """A stream's chunks decoded from its content coding, `limit` bytes in all at most."""
    coding = content_encoding(headers)
    if not coding:
        async for chunk in chunks:
            yield chunk
        return
    decoder, total = _decompressor(coding), 0
    async for chunk in chunks:
        try:
            out = decoder.decompress(chunk, limit + 1 - total)
        except zlib.error as exc:
            raise UndecodableError(f"the {coding} stream is corrupt") from exc
        total += len(out)
        if total > limit or decoder.unconsumed_tail:
            raise UndecodableError(f"the stream decodes to more than {limit} bytes")
        if out:
            yield out
