"""The node record as mDNS TXT properties: short keys, string values, a version, an HMAC."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from meshroute_middleware.core import InvalidNodeError, NodeRecord, parse_node

PROTOCOL_VERSION = "1"
# DNS TXT: each "key=value" string is at most 255 bytes (RFC 6763 §6.1).
MAX_ENTRY_BYTES = 255
# RFC 6763 §6.2: keep the whole TXT record under 1300 bytes so it fits one packet.
MAX_RECORD_BYTES = 1300
MAX_ENTRIES = 16

# short TXT key -> NodeRecord field
KEYS: dict[str, str] = {
    "id": "node_id", "m": "model", "s": "start", "e": "end", "l": "layers",
    "u": "url", "t": "tps", "q": "queue", "r": "rep",
}
VERSION_KEY = "v"
SIG_KEY = "sig"

TxtProperties = Mapping[Any, Any]  # zeroconf gives bytes; every key and value is checked


def _canonical(props: Mapping[str, str]) -> bytes:
    """Sorted `key=value` lines of every property except the signature."""
    lines = [f"{k}={props[k]}" for k in sorted(props) if k != SIG_KEY]
    return "\n".join(lines).encode()


def sign(props: Mapping[str, str], secret: str) -> str:
    """HMAC-SHA256 (hex) of the canonical record under the mesh secret."""
    return hmac.new(secret.encode(), _canonical(props), hashlib.sha256).hexdigest()


def _fmt_float(value: float) -> str:
    return f"{value:.6g}"


def encode_record(record: NodeRecord, secret: str | None = None) -> dict[str, str]:
    """TXT properties for a node record, signed when a mesh secret is given."""
    fields = record.to_dict()
    props = {VERSION_KEY: PROTOCOL_VERSION}
    for short, name in KEYS.items():
        value = fields[name]
        props[short] = _fmt_float(value) if isinstance(value, float) else str(value)
    if secret:
        props[SIG_KEY] = sign(props, secret)
    for key, value in props.items():
        if len(key) + 1 + len(value.encode()) > MAX_ENTRY_BYTES:
            raise InvalidNodeError(f"TXT entry '{key}' exceeds {MAX_ENTRY_BYTES} bytes")
    return props


def _text(raw: Any, key: str) -> str:
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, bytes):
        raise InvalidNodeError(f"TXT entry '{key}' is neither text nor bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise InvalidNodeError(f"TXT value of '{key}' is not valid UTF-8") from None


def _decode_props(props: TxtProperties) -> dict[str, str]:
    """Bytes-or-str TXT properties as checked strings; raise InvalidNodeError."""
    if len(props) > MAX_ENTRIES:
        raise InvalidNodeError(f"TXT record has {len(props)} entries (max {MAX_ENTRIES})")
    out: dict[str, str] = {}
    total_bytes = 0
    for raw_key, raw_value in props.items():
        key = _text(raw_key, "<key>")
        value = _text(raw_value, key)
        size = len(key.encode()) + 1 + len(value.encode())
        if size > MAX_ENTRY_BYTES:
            raise InvalidNodeError(f"TXT entry '{key[:32]}' exceeds {MAX_ENTRY_BYTES} bytes")
        total_bytes += size + 1
        out[key] = value
    if total_bytes > MAX_RECORD_BYTES:
        raise InvalidNodeError(f"TXT record exceeds {MAX_RECORD_BYTES} bytes")
    return out


def _check_signature(props: Mapping[str, str], secret: str | None) -> None:
    if not secret:
        return
    got = props.get(SIG_KEY)
    if not got:
        raise InvalidNodeError("record is unsigned but a mesh secret is set")
    if not hmac.compare_digest(got, sign(props, secret)):
        raise InvalidNodeError("record signature does not match the mesh secret")


def decode_record(props: TxtProperties, *, secret: str | None = None,
                  now: float = 0.0) -> NodeRecord:
    """Validate TXT properties into a NodeRecord (via parse_node); raise InvalidNodeError."""
    text = _decode_props(props)
    version = text.get(VERSION_KEY)
    if version != PROTOCOL_VERSION:
        raise InvalidNodeError(f"unsupported record version {version!r} "
                               f"(expected {PROTOCOL_VERSION!r})")
    _check_signature(text, secret)
    fields = {name: text[short] for short, name in KEYS.items() if short in text}
    return parse_node(fields, now=now)
