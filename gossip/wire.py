"""The gossip wire format, pure: versioned msgpack frames, HMAC-SHA256 tags, strict decoding.

A frame (wire version 2) is the msgpack array
`[version, type, sender, sent_at, nonce, reply_to, body, tag]`; `body` is the msgpack of the typed
payload, `tag` is HMAC-SHA256 over a domain prefix, the header and the body (nil without a shared
secret). `nonce` is 64 unpredictable bits (`replay.new_nonce`), `reply_to` the nonce of the frame
this one answers (0 for a request). Version 1 frames (no `reply_to`) are refused as `version`.

Decoding checks size, shape and every field's type and range before anything reaches the state.
A fault in the frame's structure refuses the frame (a `GossipError` subclass); an item whose
values are out of range refuses only that item (`Message.refused`, `Message.refused_curves`).
The bodies live by job: route statistics in `stats_wire`, provider reports in `reports_wire`,
replay protection in `replay`, the checks they share in `checks`.
"""

from __future__ import annotations

import hashlib
import hmac
import math
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from meshroute_middleware.core.contracts.limits import MAX_ID_CHARS, MAX_SIGNATURE_CHARS
from meshroute_middleware.core.providers.peers import PeerState

from . import errors as err
from . import state as st
from .checks import MAX_COUNT, Refused, as_map, fail, integer, is_int, number, pack, text, unpack
from .replay import REPLAY_WINDOW_S, ReplayGuard, new_nonce
from .reports_wire import Reports, read_report, read_reports, report_obj, reports_obj
from .stats_wire import delta_obj, digest_obj, read_delta, read_digest

WIRE_VERSION = 2  # 2: reply_to in the header, entries refused one by one
MAX_FRAME_BYTES = 1024 * 1024  # bounds memory per message; a full delta is ~160 KiB
TAG_BYTES = 32  # HMAC-SHA256
_SIGN_PREFIX = b"meshroute-gossip\x00"


class MessageType(IntEnum):
    """Append-only: never renumber or reuse a value."""

    DIGEST = 1  # initiator -> peer: what I hold
    DELTA = 2  # entries the receiver lacks; as a reply it also carries the sender's digest
    ACK = 3  # reply to a pushed delta: how many entries were applied
    PROVIDERS = 4  # the sender's provider report (issue 23); answered with the receiver's
    PROVIDER_REPORTS = 5  # every origin's newest provider report the sender holds, relayed;
    # answered with the receiver's. A new type, not a new PROVIDERS body: a peer that speaks
    # only 4 refuses 5 cleanly (unknown_type, counted, no reply) and is then sent 4


@dataclass(frozen=True, slots=True)
class Ack:
    """The receiver of a pushed delta applied `applied` entries."""

    applied: int = 0


Body = st.Digest | st.Delta | Ack | PeerState | Reports
_KINDS = frozenset(int(k) for k in MessageType)
_BODY_TYPE: dict[MessageType, type] = {MessageType.DIGEST: st.Digest,
                                       MessageType.DELTA: st.Delta, MessageType.ACK: Ack,
                                       MessageType.PROVIDERS: PeerState,
                                       MessageType.PROVIDER_REPORTS: Reports}


@dataclass(frozen=True, slots=True)
class Message:
    """One decoded, validated message; `refused` counts the items dropped from its body."""

    kind: MessageType
    sender: str
    sent_at: float
    body: Body
    size_bytes: int = 0
    nonce: int = 0
    reply_to: int = 0
    refused: int = 0
    refused_curves: int = 0  # entries dropped for a bad curve summary (or a curve alone)


def _body_obj(body: Body) -> dict[str, Any]:
    if isinstance(body, st.Digest):
        return digest_obj(body)
    if isinstance(body, st.Delta):
        return delta_obj(body)
    if isinstance(body, PeerState):
        return report_obj(body)
    if isinstance(body, Reports):
        return reports_obj(body)
    return {"n": body.applied}


def _body(kind: MessageType, obj: Any, refused: Refused) -> Body:
    if kind is MessageType.DIGEST:
        return read_digest(obj, refused)
    if kind is MessageType.DELTA:
        return read_delta(obj, refused)
    if kind is MessageType.PROVIDERS:
        return read_report(obj)
    if kind is MessageType.PROVIDER_REPORTS:
        return read_reports(obj, refused)
    return Ack(integer(as_map(obj, "ack").get("n"), "applied", MAX_COUNT))


def _signed_bytes(header: list[Any], body: bytes) -> bytes:
    return _SIGN_PREFIX + pack(header) + body


class WireCodec:
    """Encodes and decodes frames for one tracker; with a secret, signs and verifies."""

    def __init__(self, sender: str, secret: bytes | None = None, *,
                 window_s: float = REPLAY_WINDOW_S,
                 max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        if secret is not None and not secret:
            raise ValueError("an empty gossip secret would authenticate nothing")
        self.sender = text(sender, "sender", MAX_ID_CHARS) if sender else sender
        self.secret = secret
        self.max_frame_bytes = max_frame_bytes
        self._guard = ReplayGuard(window_s)

    @property
    def authenticated(self) -> bool:
        """Whether frames are signed and verified (a shared secret is set)."""
        return self.secret is not None

    def encode(self, body: Body, now: float, *, nonce: int | None = None,
               reply_to: int = 0) -> bytes:
        """One signed (when a secret is set) frame carrying `body`; `nonce` defaults to a new
        one, `reply_to` names the frame this one answers."""
        kind = next(k for k, t in _BODY_TYPE.items() if isinstance(body, t))
        header = [WIRE_VERSION, int(kind), self.sender, float(now),
                  new_nonce() if nonce is None else nonce, reply_to]
        payload = pack(_body_obj(body))
        tag = None
        if self.secret is not None:
            tag = hmac.new(self.secret, _signed_bytes(header, payload), hashlib.sha256).digest()
        return pack([*header, payload, tag])

    def decode(self, data: bytes, now: float) -> Message:
        """Validate and decode one frame; raise a GossipError subclass on any fault."""
        if len(data) > self.max_frame_bytes:
            raise err.OversizedMessage(f"{len(data)} bytes > {self.max_frame_bytes}")
        frame = unpack(data, max_str_len=MAX_ID_CHARS, max_bin_len=self.max_frame_bytes,
                       max_array_len=8, max_map_len=0)
        if not isinstance(frame, list) or not frame:
            raise fail("a frame must be an array")
        version = frame[0]
        if not is_int(version) or version != WIRE_VERSION:
            raise err.UnsupportedVersion(f"wire version {version!r}, we speak {WIRE_VERSION}")
        if len(frame) != 8:
            raise fail("a frame must be an array of 8 fields")
        _, kind_raw, sender, sent_at, nonce, reply_to, payload, tag = frame
        if not is_int(kind_raw) or kind_raw not in _KINDS:
            raise err.UnknownMessageType(f"message type {kind_raw!r}")
        kind = MessageType(kind_raw)
        sender = text(sender, "sender", MAX_ID_CHARS)
        sent_at = number(sent_at, "sent_at", -math.inf)
        integer(nonce, "nonce", 2**64 - 1)
        integer(reply_to, "reply_to", 2**64 - 1)
        if not isinstance(payload, bytes):
            raise fail("body must be bytes")
        self._authenticate(frame[:6], payload, tag, now)
        obj = unpack(payload, max_str_len=MAX_SIGNATURE_CHARS, max_bin_len=0, max_array_len=8,
                     max_map_len=st.MAX_DIGEST_ENTRIES)
        refused = Refused()
        body = _body(kind, obj, refused)
        return Message(kind, sender, sent_at, body, len(data), nonce, reply_to, refused.n,
                       refused.curves)

    def _authenticate(self, header: list[Any], payload: bytes, tag: Any, now: float) -> None:
        if self.secret is None:
            return
        if tag is None:
            raise err.UnsignedMessage("a shared secret is set and the message carries no tag")
        if not isinstance(tag, bytes) or len(tag) != TAG_BYTES:
            raise err.ForgedMessage("the tag is not an HMAC-SHA256")
        want = hmac.new(self.secret, _signed_bytes(header, payload), hashlib.sha256).digest()
        if not hmac.compare_digest(want, tag):
            raise err.ForgedMessage("the HMAC tag does not verify")
        self._guard.check(tag, header[3], now)
