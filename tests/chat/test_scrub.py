"""The key scrubber (chat/scrub.py): every form a client could read, in bodies, headers and
streams, a key split across chunks included; compressed bodies decoded within a bound."""

from __future__ import annotations

import gzip
import json
import urllib.parse
import zlib
from collections.abc import AsyncIterator

import pytest

from meshroute_middleware.chat.scrub import (
    Scrubber,
    UndecodableError,
    decode_body,
    decode_stream,
)

KEY = "sk-live/Ab12+Cd34/Ef56==XYZ"  # the key: `/`, `+` and `=` all need escaping
OTHER = "sk-live-other-0000"
S = Scrubber([KEY, OTHER])


def quote(text: str) -> str:
    return urllib.parse.quote(text, safe="")


FORMS = {
    "raw": KEY,
    "json string": json.dumps(KEY)[1:-1],
    "json \\/": KEY.replace("/", "\\/"),
    "json \\u": "".join(f"\\u{ord(c):04x}" if c in "/+=" else c for c in KEY),
    "json \\u upper": "".join(f"\\u{ord(c):04X}" if c in "/+=s" else c for c in KEY),
    "json twice": json.dumps(KEY.replace("/", "\\/"))[1:-1],  # \\\/ in a quoted string
    "url": quote(KEY),
    "url lower hex": quote(KEY).replace("%2F", "%2f").replace("%2B", "%2b"),
    "url every char": "".join(f"%{b:02X}" for b in KEY.encode()),
    "url twice": quote(quote(KEY)),
    "mixed": KEY.replace("/", "%2F", 1).replace("/", "\\/"),
}


@pytest.mark.parametrize("form", FORMS.values(), ids=list(FORMS))
def test_every_form_of_a_key_is_scrubbed(form: str) -> None:
    body = f'{{"error": {{"message": "bad key {form} given"}}}}'.encode()
    assert S.scrub(body) == b'{"error": {"message": "bad key *** given"}}'
    assert S.text(f"Bearer {form}") == "Bearer ***"


def test_what_is_no_key_is_left_alone() -> None:
    for text in (b"sk-live/Ab12+Cd34", b"sk-live%2FAb12", b"data: {}\n\n", b"", b"\\\\/%%2",
                 b"SK-LIVE/AB12+CD34/EF56==XYZ"):
        assert S.scrub(text) == text
    assert Scrubber([]).scrub(KEY.encode()) == KEY.encode()


def test_headers_names_and_values() -> None:
    headers = [(b"x-request-id", f"req-{KEY}".encode()), (b"content-type", b"text/plain"),
               (b"x-echo", quote(KEY).encode())]
    assert S.headers(headers) == [(b"x-request-id", b"req-***"),
                                  (b"content-type", b"text/plain"), (b"x-echo", b"***")]


@pytest.mark.parametrize("form", ["raw", "json \\/", "json \\u", "url", "url twice"])
def test_a_key_split_anywhere_across_three_chunks_is_caught(form: str) -> None:
    event = f'data: {{"content": "key {FORMS[form]}!"}}\n\n'.encode()
    for i in range(len(event) + 1):
        for j in range(i, len(event) + 1):
            stream = S.stream()
            out = [stream.feed(event[:i]), stream.feed(event[i:j]), stream.feed(event[j:])]
            out.append(stream.flush())
            assert b"".join(out) == b'data: {"content": "key ***!"}\n\n', (i, j)


def test_a_chunk_without_a_key_prefix_is_not_delayed() -> None:
    stream = S.stream()
    chunks = [b'data: {"content": "t0 "}\n\n', b"data: [DONE]\n\n", b"plain s", b"k-l",
              b"ive then not\n", b"%2", b"x", b"\\", b"\\"]
    sent = [stream.feed(c) for c in chunks]
    assert sent[:2] == chunks[:2]  # whole, at once: no byte of them could start a key
    assert sent[2:5] == [b"plain ", b"", b"sk-live then not\n"]  # held only while it could
    assert sent[5:] == [b"", b"%2x", b"", b""] and stream.flush() == b"\\\\"


def test_many_keys_sharing_a_prefix() -> None:
    keys = [f"sk-proj-{i:03d}-{'x' * 30}" for i in range(50)]
    many = Scrubber(keys)
    text = " ".join(keys[::7]) + " sk-proj-999"
    assert many.scrub(text.encode()) == b" ".join([b"***"] * len(keys[::7])) + b" sk-proj-999"


def test_decode_body_gzip_deflate_and_bounds() -> None:
    plain = b'{"error": "x"}'
    assert decode_body([(b"Content-Encoding", b"gzip")], gzip.compress(plain)) == plain
    assert decode_body([(b"content-encoding", b"deflate")], zlib.compress(plain)) == plain
    assert decode_body([(b"content-encoding", b"identity")], plain) == plain
    assert decode_body([], plain) == plain
    bomb = gzip.compress(b"\0" * (8 << 20))
    with pytest.raises(UndecodableError, match="more than"):
        decode_body([(b"content-encoding", b"gzip")], bomb, limit=1 << 20)
    with pytest.raises(UndecodableError, match="corrupt"):
        decode_body([(b"content-encoding", b"gzip")], b"not gzip")
    with pytest.raises(UndecodableError, match="br"):
        decode_body([(b"content-encoding", b"br")], b"...")


@pytest.mark.anyio
async def test_decode_stream() -> None:
    packed = gzip.compress(b"data: a\n\n" * 1000)

    async def chunks() -> AsyncIterator[bytes]:
        for i in range(0, len(packed), 7):
            yield packed[i:i + 7]

    out = [c async for c in decode_stream([(b"content-encoding", b"gzip")], chunks())]
    assert b"".join(out) == b"data: a\n\n" * 1000
    with pytest.raises(UndecodableError):
        async for _ in decode_stream([(b"content-encoding", b"gzip")], chunks(), limit=100):
            pass


def test_a_truncated_gzip_body_is_undecodable() -> None:
    with pytest.raises(UndecodableError, match="truncated"):
        decode_body([(b"content-encoding", b"gzip")], gzip.compress(b"x" * 1000)[:12])
