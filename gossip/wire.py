"""The gossip wire format, pure: versioned msgpack frames, HMAC-SHA256 tags, strict decoding.

A frame (wire version 2) is the msgpack array
`[version, type, sender, sent_at, nonce, reply_to, body, tag]`; `body` is the msgpack of the typed
payload, `tag` is HMAC-SHA256 over a domain prefix, the header and the body (nil without a shared
secret). `nonce` is 64 unpredictable bits (`new_nonce`), `reply_to` the nonce of the frame this one
answers (0 for a request). Version 1 frames (no `reply_to`) are refused as `version`.

Replay protection that survives a restart: a pushed DELTA is accepted only as the answer to a
DELTA this process sent (its `reply_to` names a nonce held by `Challenges`, each usable once,
expiring after `REPLAY_WINDOW_S`), and a reply only when it names the request it answers. A
process that restarts holds no challenge, so a frame recorded before the restart answers nothing;
no state is persisted. Signed frames are also checked against the clock and for exact copies
within the window (`ReplayGuard`).

Decoding checks size, shape and every field's type and range before anything reaches the state.
A fault in the frame's structure refuses the frame (a `GossipError` subclass); a statistics
entry, digest version or change time whose values are out of range refuses only that item,
counted in `Message.refused` under `invalid_entry`. `sendable` applies the very same entry check
before an entry is put on the wire, so a peer never refuses what we send.

An entry's saturation-curve summary (issue 14) travels beside the entries, in the delta body's
optional map `k` ({model: {signature: {origin: [[bin, mass, mean log tps], ...]}}}), so a
version 2 decoder that predates it ignores it (a body's unknown keys are skipped) and still
takes the entry, whose 8-field leaf is unchanged: no version bump. A curve is checked as
strictly as an entry (`core.stats.parse_curve`, the state file's check too: at most
`MAX_CURVE_BINS` bins, strictly ascending in 0..`MAX_CURVE_BIN`, masses finite and >= 0, means
finite and within the log of the tokens/s bounds); a bad one, or one naming no entry of the
delta, refuses its entry too, counted in `Message.refused_curves` (`invalid_curve`). We only
put on the wire curves that pass the check.
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, TypeVar

import msgpack

from meshroute_middleware.core.contracts.limits import (
    MAX_ERROR_CHARS,
    MAX_ID_CHARS,
    MAX_SIGNATURE_CHARS,
    MAX_TPS,
)
from meshroute_middleware.core.providers.peers import PeerState, Usage
from meshroute_middleware.core.providers.scoring import PENALTY_CAP, RouteStats
from meshroute_middleware.core.stats import (
    Curve,
    StatEntry,
    checked_int,
    checked_number,
    parse_curve,
)

from . import errors as err
from . import state as st

WIRE_VERSION = 2  # 2: reply_to in the header, entries refused one by one
MAX_FRAME_BYTES = 1024 * 1024  # bounds memory per message; a full delta is ~160 KiB
MAX_COUNT = 2**53  # counts stay exact as floats
MAX_MASS = 1e9  # decayed weights: ~1.4 million samples/s sustained over a 600 s half-life
MAX_TTFB_S = 3600.0  # no first byte is awaited for an hour
REPLAY_WINDOW_S = 30.0  # signed timestamps further from our clock are refused
MAX_REPLAY_TAGS = 65_536  # tags remembered for duplicate detection (oldest evicted first)
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


@dataclass(frozen=True, slots=True)
class Reports:
    """Provider reports by origin (the sender's own among them), newest the sender holds."""

    by_origin: dict[str, PeerState] = field(default_factory=dict)


Body = st.Digest | st.Delta | Ack | PeerState | Reports
_KINDS = frozenset(int(k) for k in MessageType)
_BODY_TYPE: dict[MessageType, type] = {MessageType.DIGEST: st.Digest,
                                       MessageType.DELTA: st.Delta, MessageType.ACK: Ack,
                                       MessageType.PROVIDERS: PeerState,
                                       MessageType.PROVIDER_REPORTS: Reports}


INVALID_ENTRY = "invalid_entry"  # counter label of an item refused for its values
INVALID_CURVE = "invalid_curve"  # an entry refused for its curve summary's values


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


def new_nonce() -> int:
    """64 unpredictable, non-zero bits (0 means "answers nothing")."""
    return secrets.randbelow(2**64 - 1) + 1


# -- encoding ---------------------------------------------------------------------------------

def _nest(flat: Mapping[st.EntryKey, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (model, sig, origin), value in flat.items():
        out.setdefault(model, {}).setdefault(sig, {})[origin] = value
    return out


def _digest_obj(digest: st.Digest) -> dict[str, Any]:
    versions = {k: [float(t), fp] for k, (t, fp) in digest.versions.items()}
    return {"v": _nest(versions), "c": dict(digest.changes), "f": dict(digest.shapes)}


def _entry_obj(e: StatEntry) -> list[Any]:
    return [e.value, e.mass, e.t, e.ttfb_s, e.ok, e.fail, e.count, e.last_error]


def _curve_obj(curve: Curve) -> list[list[Any]]:
    return [[key, mass, mean] for key, mass, mean in curve]


def _body_obj(body: Body) -> dict[str, Any]:
    if isinstance(body, st.Digest):
        return _digest_obj(body)
    if isinstance(body, st.Delta):
        entries = {k: _entry_obj(e) for k, e in body.entries.items()}
        curves = {k: _curve_obj(e.curve) for k, e in body.entries.items()
                  if e.curve and curve_sendable(e.curve)}
        digest = None if body.digest is None else _digest_obj(body.digest)
        obj = {"e": _nest(entries), "c": dict(body.changes), "d": digest,
               "f": dict(body.shapes)}
        if curves:  # only then: a delta without curves is byte for byte what it was
            obj["k"] = _nest(curves)
        return obj
    if isinstance(body, PeerState):
        return _report_obj(body)
    if isinstance(body, Reports):
        return {"v": REPORTS_VERSION, "o": {o: _report_obj(r) for o, r in body.by_origin.items()}}
    return {"n": body.applied}


# -- provider reports (issue 23): {name: {"key position": leaf}} maps, every leaf checked ------

MAX_REPORT_NAMES = 256  # routes or providers one report may name
MAX_REPORT_KEYS = 1024  # key positions under one name
MAX_TTFB_MS = MAX_TTFB_S * 1000


def _by_key(items: Mapping[tuple[str, int], Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for (name, key), leaf in items.items():
        out.setdefault(name, {})[str(key)] = leaf
    return out


def _report_obj(r: PeerState) -> dict[str, Any]:
    return {"t": r.t,
            "s": {n: [s.ok, s.fail, s.tokens_per_s, s.ttfb_ms, s.penalty, s.penalty_at]
                  for n, s in r.stats.items()},
            "c": _by_key({k: list(v) for k, v in r.cooldowns.items()}),
            "r": _by_key({k: list(v) for k, v in r.revoked.items()}),
            "x": _by_key(dict(r.clears)),
            "u": _by_key({k: list(v) for k, v in r.usage.items()})}


def _keyed(obj: Any, what: str, leaf: Callable[[Any], T],
           low_key: int = 1) -> dict[tuple[str, int], T]:
    names = _map(obj, what)
    if len(names) > MAX_REPORT_NAMES:
        raise _fail(f"more than {MAX_REPORT_NAMES} names in {what}")
    out: dict[tuple[str, int], T] = {}
    for name, keys in names.items():
        _text(name, what, MAX_ID_CHARS)
        keys = _map(keys, what)
        if len(keys) > MAX_REPORT_KEYS:
            raise _fail(f"more than {MAX_REPORT_KEYS} keys in {what}")
        for key, value in keys.items():
            if not isinstance(key, str) or not key.isdigit() or len(key) > 4 or not (
                    low_key <= int(key) <= MAX_REPORT_KEYS):
                raise _fail(f"{what}: a key position must be {low_key}..{MAX_REPORT_KEYS}")
            out[(name, int(key))] = leaf(value)
    return out


def _pair(leaf: Any, what: str) -> list[Any]:
    if not isinstance(leaf, list) or len(leaf) != 2:
        raise _fail(f"{what} must be [value, set at]")
    return leaf


def _cooldown(leaf: Any) -> tuple[float, float]:
    until, at = _pair(leaf, "a cooldown")
    return _number(until, "until", -math.inf), _number(at, "set at", -math.inf)


def _revocation(leaf: Any) -> tuple[int, float]:
    status, at = _pair(leaf, "a revocation")
    if status not in (401, 403) or not _is_int(status):
        raise _fail("a revocation's status must be 401 or 403")
    return int(status), _number(at, "set at", -math.inf)


def _usage(leaf: Any) -> Usage:
    if not isinstance(leaf, list) or len(leaf) != 5:
        raise _fail("usage must be [minute requests, minute tokens, day, day requests, "
                    "day tokens]")
    minute_r, minute_t, day_r, day_t = (_int(x, "usage", MAX_COUNT)
                                        for x in (leaf[0], leaf[1], leaf[3], leaf[4]))
    if not _is_int(leaf[2]) or not -1 <= leaf[2] <= 10**7:
        raise _fail("usage day must be a UTC day number")
    return Usage(minute_r, minute_t, int(leaf[2]), day_r, day_t)


def _stats(leaf: Any) -> RouteStats:
    if not isinstance(leaf, list) or len(leaf) != 6:
        raise _fail("route statistics must be [ok, fail, tps, ttfb_ms, penalty, penalty_at]")
    ok, fail = (_number(x, "count", 0.0, MAX_MASS) for x in leaf[:2])
    tps = None if leaf[2] is None else _number(leaf[2], "tokens_per_s", 0.0, MAX_TPS)
    ttfb = None if leaf[3] is None else _number(leaf[3], "ttfb_ms", 0.0, MAX_TTFB_MS)
    return RouteStats(ok, fail, tps, ttfb, _number(leaf[4], "penalty", 0.0, PENALTY_CAP),
                      _number(leaf[5], "penalty_at", -math.inf))


def _report(obj: Any) -> PeerState:
    body = _map(obj, "report")
    names = _map(body.get("s", {}), "statistics")
    if len(names) > MAX_REPORT_NAMES:
        raise _fail(f"more than {MAX_REPORT_NAMES} routes in statistics")
    stats = {_text(n, "route", MAX_ID_CHARS): _stats(v) for n, v in names.items()}
    return PeerState(_number(body.get("t"), "t", -math.inf), stats,
                     _keyed(body.get("c", {}), "cooldowns", _cooldown),
                     _keyed(body.get("r", {}), "revocations", _revocation),
                     _keyed(body.get("x", {}), "clears",
                            lambda at: _number(at, "cleared at", -math.inf), low_key=0),
                     _keyed(body.get("u", {}), "usage", _usage))


REPORTS_VERSION = 1  # PROVIDER_REPORTS body shape; another value is refused whole
MAX_REPORT_ORIGINS = 64  # origins one PROVIDER_REPORTS message may carry
MAX_REPORT_ITEMS = 8_192  # statistics, cooldowns, revocations, clears and usage, all origins


def report_items(r: PeerState) -> int:
    """How many items a report carries (what MAX_REPORT_ITEMS bounds)."""
    return len(r.stats) + len(r.cooldowns) + len(r.revoked) + len(r.clears) + len(r.usage)


def _reports(obj: Any, refused: _Refused) -> Reports:
    """Every origin's report, each checked on its own: a bad one is dropped and counted."""
    body = _map(obj, "reports")
    version = body.get("v")
    if not _is_int(version) or version != REPORTS_VERSION:
        raise err.UnsupportedVersion(f"provider reports version {version!r}, we speak "
                                     f"{REPORTS_VERSION}")
    origins = _map(body.get("o"), "reports")
    if len(origins) > MAX_REPORT_ORIGINS:
        raise err.OversizedMessage(f"more than {MAX_REPORT_ORIGINS} origins in reports")
    out: dict[str, PeerState] = {}
    items = 0
    for origin, leaf in origins.items():
        name = _text(origin, "origin", MAX_ID_CHARS)
        try:
            report = _report(leaf)
        except err.MalformedMessage:
            refused.n += 1
            continue
        items += report_items(report)
        if items > MAX_REPORT_ITEMS:
            raise err.OversizedMessage(f"more than {MAX_REPORT_ITEMS} items in reports")
        out[name] = report
    return Reports(out)


def bounded_reports(own: str, mine: PeerState, others: Mapping[str, PeerState]) -> Reports:
    """What a tracker sends: its own report, then the newest others' while they fit the
    caps (the rest go to whichever peer relays them next)."""
    out, items = {own: mine}, report_items(mine)
    for origin, report in sorted(others.items(), key=lambda o: -o[1].t):
        if len(out) >= MAX_REPORT_ORIGINS or items + report_items(report) > MAX_REPORT_ITEMS:
            continue
        out[origin] = report
        items += report_items(report)
    return Reports(out)


def _pack(obj: Any) -> bytes:
    data: bytes = msgpack.packb(obj)
    return data


def _signed_bytes(header: list[Any], body: bytes) -> bytes:
    return _SIGN_PREFIX + _pack(header) + body


# -- decoding helpers: every field is checked, nothing is trusted -------------------------------

def _fail(what: str) -> err.MalformedMessage:
    return err.MalformedMessage(what)


def _map(obj: Any, what: str) -> dict[Any, Any]:
    if not isinstance(obj, dict):
        raise _fail(f"{what} must be a map")
    return obj


def _text(obj: Any, what: str, max_chars: int) -> str:
    if not isinstance(obj, str) or not obj or len(obj) > max_chars or not obj.isprintable():
        raise _fail(f"{what} must be a printable string of 1..{max_chars} characters")
    return obj


def _number(obj: Any, what: str, low: float = 0.0, high: float = math.inf) -> float:
    try:
        return checked_number(obj, what, low, high)
    except ValueError as exc:
        raise _fail(str(exc)) from None


def _is_int(obj: Any) -> bool:
    return isinstance(obj, int) and not isinstance(obj, bool)


def _int(obj: Any, what: str, high: int) -> int:
    try:
        return checked_int(obj, what, high)
    except ValueError as exc:
        raise _fail(str(exc)) from None


def _walk(obj: Any, what: str) -> list[tuple[st.EntryKey, Any]]:
    """Flatten {model: {signature: {origin: leaf}}} with every key checked."""
    out: list[tuple[st.EntryKey, Any]] = []
    for model, sigs in _map(obj, what).items():
        _text(model, "model", MAX_ID_CHARS)
        for sig, origins in _map(sigs, what).items():
            _text(sig, "signature", MAX_SIGNATURE_CHARS)
            for origin, leaf in _map(origins, what).items():
                out.append(((model, sig, _text(origin, "origin", MAX_ID_CHARS)), leaf))
    return out


class _Refused:
    """Counts the items a decode dropped for their values."""

    def __init__(self) -> None:
        self.n = 0
        self.curves = 0


T = TypeVar("T")


def _changes(obj: Any, refused: _Refused) -> dict[str, float]:
    """Topology change times per model ("c")."""
    return _per_model(_map(obj, "changes"), lambda t: _number(t, "changed_at", -math.inf),
                      refused)


def _shapes(obj: Any, refused: _Refused) -> dict[str, int]:
    """Topology fingerprints per model ("f", optional: a peer that sends none is treated as
    having another topology, as before skew was handled)."""
    if obj is None:
        return {}
    return _per_model(_map(obj, "shapes"), lambda f: _int(f, "shape", 2**32 - 1), refused)


def _per_model(items: dict[Any, Any], leaf: Callable[[Any], T],
               refused: _Refused) -> dict[str, T]:
    """{model: value} with every model id checked; a bad value is refused alone (counted)."""
    if len(items) > st.MAX_MODELS_PER_MESSAGE:
        raise _fail("too many models")
    out: dict[str, T] = {}
    for model, value in items.items():
        _text(model, "model", MAX_ID_CHARS)
        try:
            out[model] = leaf(value)
        except err.MalformedMessage:
            refused.n += 1
    return out


def _version(leaf: Any) -> st.Version:
    if not isinstance(leaf, list) or len(leaf) != 2:
        raise _fail("a version must be [t, fingerprint]")
    return (_number(leaf[0], "t", -math.inf), _int(leaf[1], "fingerprint", 2**32 - 1))


def _entry(leaf: Any) -> StatEntry:
    if not isinstance(leaf, list) or len(leaf) != 8:
        raise _fail("an entry must be [value, mass, t, ttfb_s, ok, fail, count, last_error]")
    value = _number(leaf[0], "value", 0.0, MAX_TPS)
    mass, ok, fail = (_number(x, "mass", 0.0, MAX_MASS) for x in (leaf[1], leaf[4], leaf[5]))
    t, ttfb = _number(leaf[2], "t"), _number(leaf[3], "ttfb_s", 0.0, MAX_TTFB_S)
    error = leaf[7]
    if not isinstance(error, str) or len(error) > MAX_ERROR_CHARS or not error.isprintable():
        raise _fail("last_error must be a string")
    return StatEntry(value, mass, t, ttfb, ok, fail, _int(leaf[6], "count", MAX_COUNT), error)


def _curve(leaf: Any) -> Curve:
    try:
        return parse_curve(leaf)  # the one check, shared with the state file
    except ValueError as exc:
        raise _fail(str(exc)) from exc


def _with_curves(entries: dict[st.EntryKey, StatEntry], obj: Any,
                 refused: _Refused) -> dict[st.EntryKey, StatEntry]:
    """Attach each curve to its entry; a bad curve drops its entry, a curve without an
    entry is dropped, both counted in `refused.curves`."""
    if obj is None:
        return entries
    pairs = _walk(obj, "curves")
    _bounded(pairs, st.MAX_ENTRIES_PER_MESSAGE)
    for key, leaf in pairs:
        entry = entries.get(key)
        try:
            curve = _curve(leaf)
        except err.MalformedMessage:
            curve = None
        if entry is None or curve is None:
            refused.curves += 1
            entries.pop(key, None)
        else:
            entries[key] = entry._replace(curve=curve)
    return entries


def _bounded(pairs: list[tuple[st.EntryKey, Any]], max_entries: int) -> None:
    if len(pairs) > max_entries:
        raise _fail(f"more than {max_entries} entries")
    if len({k[2] for k, _ in pairs}) > st.MAX_ORIGINS_PER_MESSAGE:
        raise _fail(f"more than {st.MAX_ORIGINS_PER_MESSAGE} origins")


def _each(pairs: list[tuple[st.EntryKey, Any]], parse: Any,
          refused: _Refused) -> dict[st.EntryKey, Any]:
    """Parse every leaf; a leaf with a bad value is dropped and counted, the rest kept."""
    out: dict[st.EntryKey, Any] = {}
    for key, leaf in pairs:
        try:
            out[key] = parse(leaf)
        except err.MalformedMessage:
            refused.n += 1
    return out


def _digest(obj: Any, refused: _Refused) -> st.Digest:
    body = _map(obj, "digest")
    pairs = _walk(body.get("v"), "versions")
    _bounded(pairs, st.MAX_DIGEST_ENTRIES)
    return st.Digest(_each(pairs, _version, refused), _changes(body.get("c"), refused),
                     _shapes(body.get("f"), refused))


def _delta(obj: dict[Any, Any], refused: _Refused) -> st.Delta:
    pairs = _walk(obj.get("e"), "entries")
    _bounded(pairs, st.MAX_ENTRIES_PER_MESSAGE)
    digest = None if obj.get("d") is None else _digest(obj.get("d"), refused)
    entries = _with_curves(_each(pairs, _entry, refused), obj.get("k"), refused)
    return st.Delta(entries, _changes(obj.get("c"), refused), digest,
                    _shapes(obj.get("f"), refused))


def _body(kind: MessageType, obj: Any, refused: _Refused) -> Body:
    if kind is MessageType.DIGEST:
        return _digest(obj, refused)
    if kind is MessageType.DELTA:
        return _delta(_map(obj, "delta"), refused)
    if kind is MessageType.PROVIDERS:
        return _report(obj)
    if kind is MessageType.PROVIDER_REPORTS:
        return _reports(obj, refused)
    return Ack(_int(_map(obj, "ack").get("n"), "applied", MAX_COUNT))


def sendable(entry: StatEntry) -> bool:
    """Whether a peer's decoder would accept this entry (the same check, on our side)."""
    try:
        _entry(_entry_obj(entry))
    except err.MalformedMessage:
        return False
    return True


def curve_sendable(curve: Curve) -> bool:
    """Whether a peer's decoder would accept this curve summary (the same check)."""
    try:
        _curve(_curve_obj(curve))
    except err.MalformedMessage:
        return False
    return True


def _unpack(data: bytes, **limits: int) -> Any:
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=True, use_list=True,
                               max_ext_len=0, **limits)
    except Exception as exc:  # msgpack raises many types on hostile input: all are "malformed"
        raise err.MalformedMessage(f"not valid msgpack: {type(exc).__name__}") from exc


class ReplayGuard:
    """Remembers tags accepted within the window; pure, bounded."""

    def __init__(self, window_s: float = REPLAY_WINDOW_S, max_tags: int = MAX_REPLAY_TAGS):
        self.window_s = window_s
        self.max_tags = max_tags
        self._expiry: OrderedDict[bytes, float] = OrderedDict()

    def check(self, tag: bytes, sent_at: float, now: float) -> None:
        """Raise ExpiredMessage / ReplayedMessage, else remember the tag."""
        if abs(now - sent_at) > self.window_s:
            raise err.ExpiredMessage(f"timestamp {now - sent_at:+.1f} s off our clock")
        while self._expiry and next(iter(self._expiry.values())) < now:
            self._expiry.popitem(last=False)
        if tag in self._expiry:
            raise err.ReplayedMessage("an exact copy was already accepted")
        if len(self._expiry) >= self.max_tags:
            self._expiry.popitem(last=False)
        self._expiry[tag] = sent_at + self.window_s


class Challenges:
    """Nonces of the replies this process sent that ask for a push; each answers once. Pure,
    bounded (oldest evicted first), forgotten at restart: that is what refuses old pushes."""

    def __init__(self, ttl_s: float = REPLAY_WINDOW_S, max_open: int = MAX_REPLAY_TAGS):
        self.ttl_s = ttl_s
        self.max_open = max_open
        self._open: OrderedDict[int, tuple[str, float]] = OrderedDict()

    def issue(self, nonce: int, peer: str, now: float) -> None:
        """Remember that our frame `nonce` to tracker `peer` may be answered until now + ttl."""
        while self._open and (len(self._open) >= self.max_open
                              or next(iter(self._open.values()))[1] < now):
            self._open.popitem(last=False)
        self._open[nonce] = (peer, now + self.ttl_s)

    def redeem(self, reply_to: int, peer: str, now: float) -> None:
        """Consume the challenge a push answers; ReplayedMessage if there is none."""
        held = self._open.pop(reply_to, None)
        if held is None or held[0] != peer or held[1] < now:
            raise err.ReplayedMessage("a push that answers no open exchange of ours "
                                      "(a replay, or sent before our restart)")


class WireCodec:
    """Encodes and decodes frames for one tracker; with a secret, signs and verifies."""

    def __init__(self, sender: str, secret: bytes | None = None, *,
                 window_s: float = REPLAY_WINDOW_S,
                 max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        if secret is not None and not secret:
            raise ValueError("an empty gossip secret would authenticate nothing")
        self.sender = _text(sender, "sender", MAX_ID_CHARS) if sender else sender
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
        payload = _pack(_body_obj(body))
        tag = None
        if self.secret is not None:
            tag = hmac.new(self.secret, _signed_bytes(header, payload), hashlib.sha256).digest()
        return _pack([*header, payload, tag])

    def decode(self, data: bytes, now: float) -> Message:
        """Validate and decode one frame; raise a GossipError subclass on any fault."""
        if len(data) > self.max_frame_bytes:
            raise err.OversizedMessage(f"{len(data)} bytes > {self.max_frame_bytes}")
        frame = _unpack(data, max_str_len=MAX_ID_CHARS, max_bin_len=self.max_frame_bytes,
                        max_array_len=8, max_map_len=0)
        if not isinstance(frame, list) or not frame:
            raise _fail("a frame must be an array")
        version = frame[0]
        if not _is_int(version) or version != WIRE_VERSION:
            raise err.UnsupportedVersion(f"wire version {version!r}, we speak {WIRE_VERSION}")
        if len(frame) != 8:
            raise _fail("a frame must be an array of 8 fields")
        _, kind_raw, sender, sent_at, nonce, reply_to, payload, tag = frame
        if not _is_int(kind_raw) or kind_raw not in _KINDS:
            raise err.UnknownMessageType(f"message type {kind_raw!r}")
        kind = MessageType(kind_raw)
        sender = _text(sender, "sender", MAX_ID_CHARS)
        sent_at = _number(sent_at, "sent_at", -math.inf)
        _int(nonce, "nonce", 2**64 - 1)
        _int(reply_to, "reply_to", 2**64 - 1)
        if not isinstance(payload, bytes):
            raise _fail("body must be bytes")
        self._authenticate(frame[:6], payload, tag, now)
        obj = _unpack(payload, max_str_len=MAX_SIGNATURE_CHARS, max_bin_len=0, max_array_len=8,
                      max_map_len=st.MAX_DIGEST_ENTRIES)
        refused = _Refused()
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
