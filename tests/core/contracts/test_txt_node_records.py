"""TXT record codec: round trip, HMAC, and hostile input rejected with a reason."""

from __future__ import annotations

import pytest

from meshroute_middleware.core import InvalidNodeError, NodeRecord
from meshroute_middleware.core.contracts.txt import decode_node as decode_record
from meshroute_middleware.core.contracts.txt import encode_node as encode_record
from meshroute_middleware.core.contracts.txt import sign

NODE = NodeRecord("gpu-a", "qwen", 0, 21, 40, "http://127.0.0.1:9001", tps=42.5, queue=3,
                  rep=0.9)
SECRET = "mesh-secret"


def _bytes(props: dict[str, str]) -> dict[bytes, bytes | None]:
    return {k.encode(): v.encode() for k, v in props.items()}


def test_round_trip_unsigned() -> None:
    props = encode_record(NODE)
    assert props["v"] == "1" and "sig" not in props
    assert decode_record(_bytes(props)) == NODE


def test_round_trip_signed_with_bytes_keys() -> None:
    props = encode_record(NODE, SECRET)
    assert decode_record(_bytes(props), secret=SECRET, now=5.0) == NodeRecord(
        "gpu-a", "qwen", 0, 21, 40, "http://127.0.0.1:9001", 42.5, 3, 0.9, 5.0)


def test_signature_is_over_canonical_order() -> None:
    props = encode_record(NODE, SECRET)
    shuffled = dict(reversed(list(props.items())))
    assert decode_record(shuffled, secret=SECRET) == NODE


def test_signed_record_accepted_without_secret() -> None:
    assert decode_record(encode_record(NODE, SECRET)) == NODE


def _with(**changes: str | None) -> dict[str, str | None]:
    props: dict[str, str | None] = dict(encode_record(NODE))
    props.update(changes)
    return {k: v for k, v in props.items() if v != "<drop>"}


def _forged() -> dict[str, str]:
    props = encode_record(NODE, SECRET)
    props["t"] = "9999"  # claims more throughput after signing
    return props


HOSTILE: list[tuple[str, object, str | None, str]] = [
    ("missing version", _with(v="<drop>"), None, "version"),
    ("wrong version", _with(v="2"), None, "version"),
    ("missing node id", _with(id="<drop>"), None, "node_id"),
    ("missing layers", _with(l="<drop>"), None, "layers"),
    ("negative start", _with(s="-1"), None, "negative"),
    ("start after end", _with(s="30", e="20"), None, "after"),
    ("end beyond layers", _with(e="40"), None, "below"),
    ("absurd tps", _with(t="1e12"), None, "tps"),
    ("nan tps", _with(t="nan"), None, "tps"),
    ("not http url", _with(u="file:///etc/passwd"), None, "url"),
    ("non-numeric queue", _with(q="lots"), None, "queue"),
    ("empty value", _with(m=None), None, "model"),
    ("huge value", _with(m="x" * 300), None, "255"),
    ("too many entries", {**_with(), **{f"x{i}": "1" for i in range(20)}}, None, "entries"),
    ("bad utf-8 value", {**_bytes(encode_record(NODE)), b"m": b"\xff\xfe"}, None, "UTF-8"),
    ("bad utf-8 key", {**_bytes(encode_record(NODE)), b"\xc3(": b"1"}, None, "UTF-8"),
    ("unsigned with secret", encode_record(NODE), SECRET, "unsigned"),
    ("forged field", _forged(), SECRET, "signature"),
    ("wrong secret", encode_record(NODE, "other"), SECRET, "signature"),
    ("garbage signature", {**encode_record(NODE), "sig": "00" * 32}, SECRET, "signature"),
]


@pytest.mark.parametrize(("case", "props", "secret", "reason"), HOSTILE,
                         ids=[c[0] for c in HOSTILE])
def test_hostile_records_rejected(case: str, props: dict[str, str], secret: str | None,
                                  reason: str) -> None:
    with pytest.raises(InvalidNodeError, match=reason):
        decode_record(props, secret=secret)


def test_encode_refuses_oversized_entry() -> None:
    long_url = NodeRecord("n", "m", 0, 0, 1, "http://h/" + "p" * 300)
    with pytest.raises(InvalidNodeError, match="255"):
        encode_record(long_url)


def test_sign_changes_with_any_field() -> None:
    props = encode_record(NODE)
    assert sign(props, SECRET) != sign({**props, "q": "4"}, SECRET)
