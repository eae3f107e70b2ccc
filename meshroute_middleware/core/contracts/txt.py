"""The node and tracker mDNS records: service type names and the TXT codec, both directions.

A node announces its `NodeRecord` as `_meshroute._tcp.local.` with short TXT keys; a tracker
announces its id and ports as `_meshroute-trk._tcp.local.` so that trackers find each other for
gossip. Every TXT record carries a protocol version and, under a mesh secret, an HMAC-SHA256
over its canonical form. Decoding checks sizes (RFC 6763 §6), encoding, version and signature
before any field is read; node fields then go through `topology.parse_node`.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any, Final, NamedTuple

from ..capabilities import format_caps
from ..errors import InvalidNodeError, MeshRouteError
from ..topology import NodeRecord, parse_node
from .limits import MAX_ID_CHARS

# RFC 6335 §5.1: a service name is 1-15 letters, digits and hyphens. "_meshroute-tracker"
# (18) was too long and could only be registered non-strictly; "meshroute-trk" is 13.
NODE_SERVICE: Final = "_meshroute._tcp.local."
TRACKER_SERVICE: Final = "_meshroute-trk._tcp.local."
MAX_SERVICE_NAME_CHARS: Final = 15

PROTOCOL_VERSION: Final = "1"
VERSION_KEY: Final = "v"
SIG_KEY: Final = "sig"
# DNS TXT: each "key=value" string is at most 255 bytes (RFC 6763 §6.1).
MAX_ENTRY_BYTES: Final = 255
# RFC 6763 §6.2: keep the whole TXT record under 1300 bytes so it fits one packet.
MAX_RECORD_BYTES: Final = 1300
MAX_ENTRIES: Final = 24  # a full signed node record holds 17

# Node record: short TXT key -> NodeRecord field.
NODE_KEYS: Final[Mapping[str, str]] = {
    "id": "node_id", "m": "model", "s": "start", "e": "end", "l": "layers",
    "u": "url", "t": "tps", "q": "queue", "r": "rep",
}
# The node's capabilities, comma-separated (`vision,tools`; empty: plain chat only; absent: a
# node from before capabilities, core/capabilities.DEFAULT_CAPS). parse_node bounds its length
# and refuses any name it does not know.
CAPS_KEY: Final = "caps"
# The server's prefix-cache report (core/cache_prior.py), only when the node has one:
# hit rate and the most tokens a slot holds. parse_node bounds both.
CACHE_KEYS: Final[Mapping[str, str]] = {"ch": "cache_hit", "ck": "cache_tokens"}
# The server's slot count (core/slot_count.py), only when the node states one.
SLOTS_KEYS: Final[Mapping[str, str]] = {"sl": "slots"}
# The requests its engine runs and queues now, every sender's (core/node_load.py).
HELD_KEYS: Final[Mapping[str, str]] = {"hd": "held"}
# Said only by a node whose server cannot continue a trailing assistant message (issue 34).
CONTINUES_KEYS: Final[Mapping[str, str]] = {"co": "continues"}
# A node's announcement count: read by no one, it makes each TXT update differ from the
# ones before, as mDNS delivers no update whose TXT a tracker's cache still holds (a load
# going 0 -> 1 -> 0 would stay at 1: tests/node_agent/test_held_travels.py).
SERIAL_KEY: Final = "n"
# What a record carries only when the node has it.
_OPTIONAL_KEYS: Final[Mapping[str, str]] = {**CACHE_KEYS, **SLOTS_KEYS, **HELD_KEYS,
                                             **CONTINUES_KEYS}
# Tracker record: its id, HTTP port (optional) and gossip port.
TRACKER_ID_KEY, TRACKER_HTTP_KEY, TRACKER_GOSSIP_KEY = "id", "hp", "gp"

TxtProperties = Mapping[Any, Any]  # zeroconf gives bytes; every key and value is checked


class TxtError(MeshRouteError, ValueError):
    """A TXT record is oversized, not UTF-8, of another version or wrongly signed."""


class TrackerTxt(NamedTuple):
    """What a tracker's TXT record says."""

    tracker_id: str
    gossip_port: int
    http_port: int | None = None


def service_name(service_type: str) -> str:
    """The RFC 6335 service name of a type such as `_meshroute._tcp.local.`."""
    return service_type.split(".", 1)[0].removeprefix("_")


def _canonical(props: Mapping[str, str]) -> bytes:
    """Sorted `key=value` lines of every property except the signature."""
    lines = [f"{k}={props[k]}" for k in sorted(props) if k != SIG_KEY]
    return "\n".join(lines).encode()


def sign(props: Mapping[str, str], secret: str) -> str:
    """HMAC-SHA256 (hex) of the canonical record under the mesh secret."""
    return hmac.new(secret.encode(), _canonical(props), hashlib.sha256).hexdigest()


def _entry_bytes(key: str, value: str) -> int:
    return len(key.encode()) + 1 + len(value.encode())


def _seal(props: dict[str, str], secret: str | None) -> dict[str, str]:
    """Sign (under a secret) and check every entry fits a TXT string."""
    if secret:
        props[SIG_KEY] = sign(props, secret)
    for key, value in props.items():
        if _entry_bytes(key, value) > MAX_ENTRY_BYTES:
            raise TxtError(f"TXT entry '{key}' exceeds {MAX_ENTRY_BYTES} bytes")
    return props


def _text(raw: Any, key: str) -> str:
    if raw is None:
        return ""
    if isinstance(raw, str):
        return raw
    if not isinstance(raw, bytes):
        raise TxtError(f"TXT entry '{key}' is neither text nor bytes")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        raise TxtError(f"TXT value of '{key}' is not valid UTF-8") from None


def open_txt(props: TxtProperties, secret: str | None, what: str) -> dict[str, str]:
    """Bytes-or-str TXT properties as checked strings of our version, signature verified
    under a secret; TxtError otherwise. `what` names the record in messages."""
    if len(props) > MAX_ENTRIES:
        raise TxtError(f"TXT record has {len(props)} entries (max {MAX_ENTRIES})")
    text: dict[str, str] = {}
    total_bytes = 0
    for raw_key, raw_value in props.items():
        key = _text(raw_key, "<key>")
        value = _text(raw_value, key)
        size = _entry_bytes(key, value)
        if size > MAX_ENTRY_BYTES:
            raise TxtError(f"TXT entry '{key[:32]}' exceeds {MAX_ENTRY_BYTES} bytes")
        total_bytes += size + 1
        text[key] = value
    if total_bytes > MAX_RECORD_BYTES:
        raise TxtError(f"TXT record exceeds {MAX_RECORD_BYTES} bytes")
    version = text.get(VERSION_KEY)
    if version != PROTOCOL_VERSION:
        raise TxtError(f"unsupported {what} version {version!r} (expected {PROTOCOL_VERSION!r})")
    if secret:
        got = text.get(SIG_KEY)
        if not got:
            raise TxtError(f"{what} is unsigned (no signature) but a mesh secret is set")
        # bytes, not str: compare_digest refuses a str with non-ASCII characters (TypeError),
        # and a hostile record may carry any text in its signature
        if not hmac.compare_digest(got.encode("utf-8", "surrogatepass"),
                                   sign(text, secret).encode()):
            raise TxtError(f"{what} signature does not match the mesh secret")
    return text


def _fmt_float(value: float) -> str:
    return f"{value:.6g}"


def encode_node(record: NodeRecord, secret: str | None = None,
                serial: int | None = None) -> dict[str, str]:
    """TXT properties for a node record, signed when a mesh secret is given (`serial`: the
    announcement's count, SERIAL_KEY)."""
    fields = record.to_dict()
    props = {VERSION_KEY: PROTOCOL_VERSION}
    if serial is not None:
        props[SERIAL_KEY] = str(serial)
    for short, name in NODE_KEYS.items():
        value = fields[name]
        props[short] = _fmt_float(value) if isinstance(value, float) else str(value)
    props[CAPS_KEY] = format_caps(record.caps)
    for short, name in _OPTIONAL_KEYS.items():
        if name in fields:
            value = fields[name]
            props[short] = _fmt_float(value) if isinstance(value, float) else str(value)
    try:
        return _seal(props, secret)
    except TxtError as exc:
        raise InvalidNodeError(str(exc)) from None


def decode_node(props: TxtProperties, *, secret: str | None = None,
                now: float = 0.0) -> NodeRecord:
    """Validate TXT properties into a NodeRecord (via parse_node); raise InvalidNodeError."""
    try:
        text = open_txt(props, secret, "record")
    except TxtError as exc:
        raise InvalidNodeError(str(exc)) from None
    fields = {name: text[short] for short, name in NODE_KEYS.items() if short in text}
    if CAPS_KEY in text:
        fields["caps"] = text[CAPS_KEY]
    fields.update({name: text[short] for short, name in _OPTIONAL_KEYS.items() if short in text})
    return parse_node(fields, now=now)


def encode_tracker(tracker_id: str, http_port: int, gossip_port: int,
                   secret: str | None = None) -> dict[str, str]:
    """TXT properties of a tracker: its id, HTTP and gossip ports, signed with a secret."""
    props = {VERSION_KEY: PROTOCOL_VERSION, TRACKER_ID_KEY: tracker_id,
             TRACKER_HTTP_KEY: str(http_port), TRACKER_GOSSIP_KEY: str(gossip_port)}
    return _seal(props, secret)


def _port(text: str, what: str) -> int:
    if not text.isascii() or not text.isdigit() or not 0 < int(text) < 65536:
        raise TxtError(f"tracker {what} port {text[:16]!r} is not a port")
    return int(text)


def decode_tracker(props: TxtProperties, *, secret: str | None = None) -> TrackerTxt:
    """A tracker's id and ports from its TXT properties; TxtError (a ValueError) otherwise."""
    text = open_txt(props, secret, "tracker record")
    tracker_id = text.get(TRACKER_ID_KEY, "")
    if not 0 < len(tracker_id) <= MAX_ID_CHARS or not tracker_id.isprintable():
        raise TxtError(f"tracker record needs an 'id' of 1..{MAX_ID_CHARS} printable characters")
    gossip_port = _port(text.get(TRACKER_GOSSIP_KEY, ""), "gossip")
    http = text.get(TRACKER_HTTP_KEY)
    return TrackerTxt(tracker_id, gossip_port, None if http is None else _port(http, "HTTP"))
