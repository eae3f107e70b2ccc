"""gossip.wire: round trips, authentication, replay, limits, hostile bytes."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from gossip import errors as err
from gossip import state as st
from gossip.replay import Challenges
from gossip.stats_wire import sendable
from gossip.wire import WIRE_VERSION, Ack, MessageType, WireCodec
from meshroute_middleware.core.stats import StatEntry

NOW = 1_000_000.0
SECRET = b"correct horse battery staple"
ENTRY = StatEntry(42.5, 2.25, NOW - 3, 0.125, 3.0, 0.5, 7, "timeout")
DIGEST = st.Digest({("m", "m|a[0-9]", "t1"): (NOW - 3, 123456)}, {"m": NOW - 100},
                   {"m": 2**32 - 1})
DELTA = st.Delta({("m", "m|a[0-9]", "t1"): ENTRY}, {"m": NOW - 100}, DIGEST, {"m": 7})


def codec(sender: str = "t1", secret: bytes | None = SECRET) -> WireCodec:
    return WireCodec(sender, secret)


@pytest.mark.parametrize("body", [DIGEST, DELTA, st.Delta(), st.Digest(), Ack(5)])
@pytest.mark.parametrize("secret", [None, SECRET])
def test_round_trip(body: st.Digest | st.Delta | Ack, secret: bytes | None) -> None:
    message = codec("t2", secret).decode(codec("t1", secret).encode(body, NOW), NOW + 1)
    assert (message.sender, message.sent_at, message.body) == ("t1", NOW, body)
    assert message.kind is {st.Digest: MessageType.DIGEST, st.Delta: MessageType.DELTA,
                            Ack: MessageType.ACK}[type(body)]


def test_message_types_are_append_only() -> None:
    assert {m.name: m.value for m in MessageType} == {"DIGEST": 1, "DELTA": 2, "ACK": 3,
                                                      "PROVIDERS": 4, "PROVIDER_REPORTS": 5}


def test_unsigned_message_is_refused_when_a_secret_is_set() -> None:
    with pytest.raises(err.UnsignedMessage):
        codec("t2").decode(codec("t1", None).encode(DIGEST, NOW), NOW)


def test_wrong_secret_is_forged() -> None:
    with pytest.raises(err.ForgedMessage):
        codec("t2").decode(codec("t1", b"another secret").encode(DIGEST, NOW), NOW)


def tamper(frame: bytes, index: int, value: object) -> bytes:
    fields = msgpack.unpackb(frame)
    fields[index] = value
    return bytes(msgpack.packb(fields))


@pytest.mark.parametrize("index,value", [(2, "t9"), (3, NOW + 1.0), (4, 7), (5, 9),
                                         (7, b"\x00" * 32), (7, b"short")])
def test_any_change_to_a_signed_frame_is_forged(index: int, value: object) -> None:
    frame = codec().encode(DELTA, NOW)
    with pytest.raises(err.ForgedMessage):
        codec("t2").decode(tamper(frame, index, value), NOW)


def test_changed_body_is_forged() -> None:
    frame = codec().encode(DELTA, NOW)
    other = msgpack.unpackb(codec().encode(st.Delta(), NOW))[6]
    with pytest.raises(err.ForgedMessage):
        codec("t2").decode(tamper(frame, 6, other), NOW)


def test_replay_within_the_window_and_outside_it_are_refused() -> None:
    receiver = codec("t2")
    frame = codec().encode(DIGEST, NOW)
    receiver.decode(frame, NOW + 1)
    with pytest.raises(err.ReplayedMessage):
        receiver.decode(frame, NOW + 2)
    with pytest.raises(err.ExpiredMessage):
        codec("t3").decode(frame, NOW + 31)  # a fresh receiver: the timestamp alone refuses it
    with pytest.raises(err.ExpiredMessage):
        codec("t3").decode(codec().encode(DIGEST, NOW + 60), NOW)  # from the future


def test_two_identical_bodies_at_the_same_instant_are_distinct_messages() -> None:
    sender, receiver = codec(), codec("t2")
    first = receiver.decode(sender.encode(DIGEST, NOW), NOW)
    second = receiver.decode(sender.encode(DIGEST, NOW), NOW)  # the nonce differs
    assert first.nonce != second.nonce and first.nonce and second.nonce


def test_reply_to_travels_signed() -> None:
    message = codec("t2").decode(codec().encode(Ack(1), NOW, nonce=5, reply_to=9), NOW)
    assert (message.nonce, message.reply_to) == (5, 9)


def test_a_challenge_answers_once_for_its_peer_and_not_after_a_restart() -> None:
    challenges = Challenges(ttl_s=30)
    challenges.issue(11, "t1", NOW)
    with pytest.raises(err.ReplayedMessage):
        challenges.redeem(11, "t9", NOW)  # another tracker cannot use it (and it is spent)
    challenges.issue(12, "t1", NOW)
    challenges.redeem(12, "t1", NOW + 1)
    with pytest.raises(err.ReplayedMessage):
        challenges.redeem(12, "t1", NOW + 2)  # spent
    challenges.issue(13, "t1", NOW)
    with pytest.raises(err.ReplayedMessage):
        challenges.redeem(13, "t1", NOW + 31)  # expired
    challenges.issue(14, "t1", NOW)
    with pytest.raises(err.ReplayedMessage):
        Challenges().redeem(14, "t1", NOW)  # a restarted process holds nothing


def test_oversized_frame_is_refused_before_parsing() -> None:
    small = WireCodec("t2", None, max_frame_bytes=64)
    with pytest.raises(err.OversizedMessage):
        small.decode(codec(secret=None).encode(DELTA, NOW), NOW)


def frame_of(header: list[object], body: object) -> bytes:
    return bytes(msgpack.packb([*header, msgpack.packb(body), None]))


GOOD_HEADER: list[object] = [WIRE_VERSION, 2, "t1", NOW, 1, 0]


@pytest.mark.parametrize("header,error", [
    ([3, 2, "t1", NOW, 1, 0], err.UnsupportedVersion),
    ([True, 2, "t1", NOW, 1, 0], err.UnsupportedVersion),
    ([1, 2, "t1", NOW, 1], err.UnsupportedVersion),  # a version 1 frame: no reply_to
    ([WIRE_VERSION, 99, "t1", NOW, 1, 0], err.UnknownMessageType),
    ([WIRE_VERSION, [2], "t1", NOW, 1, 0], err.UnknownMessageType),
    ([WIRE_VERSION, 2, "", NOW, 1, 0], err.MalformedMessage),
    ([WIRE_VERSION, 2, "t1", float("nan"), 1, 0], err.MalformedMessage),
    ([WIRE_VERSION, 2, "t1", NOW, -1, 0], err.MalformedMessage),
    ([WIRE_VERSION, 2, "t1", NOW, 1, -1], err.MalformedMessage),
    ([WIRE_VERSION, 2, "t1", NOW, 1], err.MalformedMessage),  # version 2 with 7 fields
])
def test_bad_headers_get_specific_errors(header: list[object], error: type) -> None:
    with pytest.raises(error):
        codec("t2", None).decode(frame_of(header, {"e": {}, "c": {}, "d": None}), NOW)


def entry_body(leaf: object) -> dict[str, object]:
    return {"e": {"m": {"s": {"o": leaf}}}, "c": {}, "d": None}


GOOD_LEAF = [1.0, 1.0, NOW, 0.1, 1.0, 0.0, 1, ""]


@pytest.mark.parametrize("leaf", [
    [*GOOD_LEAF[:7]],  # too short
    [-1.0, *GOOD_LEAF[1:]],  # negative value
    [1.0, float("inf"), *GOOD_LEAF[2:]],  # infinite mass
    [2e6, *GOOD_LEAF[1:]],  # tps beyond any node's
    [2e302, *GOOD_LEAF[1:]],  # the 1e300-token usage of issue 11
    [1.0, 1e300, *GOOD_LEAF[2:]],  # a mass that would swamp every other origin
    [*GOOD_LEAF[:3], 1e9, *GOOD_LEAF[4:]],  # ttfb of 30 years
    [*GOOD_LEAF[:6], True, ""],  # a boolean count
    [*GOOD_LEAF[:6], 1, "x" * 201],  # error too long
    [*GOOD_LEAF[:2], "now", *GOOD_LEAF[3:]],  # t not a number
    [*GOOD_LEAF[:7], "a\x1b[31m"],  # escape sequence in an error
])
def test_a_bad_entry_is_dropped_and_counted_the_rest_kept(leaf: list[object]) -> None:
    body = {"e": {"m": {"s": {"bad": leaf, "good": GOOD_LEAF}}}, "c": {}, "d": None}
    message = codec("t2", None).decode(frame_of(GOOD_HEADER, body), NOW)
    assert isinstance(message.body, st.Delta) and message.refused == 1
    assert list(message.body.entries) == [("m", "s", "good")]
    if len(leaf) == 8:  # an entry holding these values is never sent either
        assert not sendable(StatEntry(*leaf))


def test_bad_change_times_and_versions_are_dropped_one_by_one() -> None:
    digest = {"v": {"m": {"s": {"o": [1.0], "p": [NOW, 5]}}}, "c": {"m": "yesterday", "n": NOW}}
    message = codec("t2", None).decode(frame_of(GOOD_HEADER, {"e": {}, "c": {"m": float("nan")},
                                                              "d": digest}), NOW)
    assert isinstance(message.body, st.Delta) and message.refused == 3
    assert message.body.changes == {}
    assert message.body.digest == st.Digest({("m", "s", "p"): (NOW, 5)}, {"n": NOW})


def test_topology_shapes_are_optional_and_bad_ones_dropped_one_by_one() -> None:
    """A peer from before clock-skew handling sends no "f": it decodes as no shapes."""
    body = {"e": {}, "c": {"m": NOW}, "d": None, "f": {"m": -1, "n": 2**32, "o": 9}}
    message = codec("t2", None).decode(frame_of(GOOD_HEADER, body), NOW)
    assert isinstance(message.body, st.Delta) and message.refused == 2
    assert message.body.shapes == {"o": 9}
    old = codec("t2", None).decode(frame_of(GOOD_HEADER, {"e": {}, "c": {}, "d": None}), NOW)
    assert isinstance(old.body, st.Delta) and old.body.shapes == {}


@pytest.mark.parametrize("body", [
    {"e": {"m": {"s": {"": GOOD_LEAF}}}, "c": {}, "d": None},  # empty origin
    {"e": {"m": {"s": {"o\n1": GOOD_LEAF}}}, "c": {}, "d": None},  # control character
    {"e": {"m": {"s" * 5000: {"o": GOOD_LEAF}}}, "c": {}, "d": None},  # signature too long
    {"e": {"m": []}, "c": {}, "d": None},  # not a map
    {"c": {}, "d": None},  # missing entries
    [1, 2, 3],  # not a map at all
])
def test_a_bad_frame_structure_is_malformed(body: object) -> None:
    with pytest.raises(err.MalformedMessage):
        codec("t2", None).decode(frame_of(GOOD_HEADER, body), NOW)


def test_too_many_entries_or_origins_are_malformed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(st, "MAX_ENTRIES_PER_MESSAGE", 2)
    many = {"e": {"m": {"s": {f"o{i}": GOOD_LEAF for i in range(3)}}}, "c": {}, "d": None}
    with pytest.raises(err.MalformedMessage):
        codec("t2", None).decode(frame_of(GOOD_HEADER, many), NOW)


@settings(max_examples=300)
@given(hs.binary(max_size=512))
def test_random_bytes_raise_only_the_base_error(data: bytes) -> None:
    for receiver in (codec("t2", None), codec("t2")):
        with pytest.raises(err.GossipError):
            receiver.decode(data, NOW)


scalars = (hs.none() | hs.booleans() | hs.integers(-(2**63), 2**64 - 1) | hs.floats()
           | hs.text(max_size=8) | hs.binary(max_size=8))
leaves = hs.recursive(scalars,
                      lambda inner: hs.lists(inner, max_size=8)
                      | hs.dictionaries(hs.text(max_size=4), inner, max_size=4), max_leaves=30)


nested = hs.dictionaries(hs.text(max_size=3), hs.dictionaries(
    hs.text(max_size=3), hs.dictionaries(hs.text(max_size=3), leaves, max_size=2), max_size=2),
    max_size=2)
shaped = hs.fixed_dictionaries(
    {"e": nested, "c": leaves, "d": leaves | hs.fixed_dictionaries({"v": leaves, "c": leaves})},
    optional={"k": nested | leaves})  # curve summaries (issue 14)


@settings(max_examples=300)
@given(hs.integers(1, 3), leaves | shaped)
def test_random_msgpack_bodies_raise_only_the_base_error(kind: int, body: object) -> None:
    """Well-formed msgpack of the wrong shape: decoded into a valid message or refused."""
    data = frame_of([WIRE_VERSION, kind, "t1", NOW, 1, 0], body)
    with contextlib.suppress(err.GossipError):
        codec("t2", None).decode(data, NOW)


@settings(max_examples=200)
@given(hs.integers(0, 200), hs.integers(0, 255))
def test_flipping_a_byte_of_a_signed_frame_never_passes_silently(pos: int, value: int) -> None:
    frame = bytearray(codec().encode(DELTA, NOW))
    pos %= len(frame)
    if frame[pos] == value:
        return
    frame[pos] = value
    with pytest.raises(err.GossipError):
        codec("t2").decode(bytes(frame), NOW)


# -- curve summaries (issue 14) ----------------------------------------------------------------

GOOD_CURVE = [[0, 5.0, 4.6], [4, 3.0, 4.2], [8, 1.5, 3.5]]
CURVE = tuple(tuple(b) for b in GOOD_CURVE)


def curve_body(curve: object, entries: dict[str, object] | None = None) -> dict[str, object]:
    """A delta of entries o1 (with `curve`) and o2 (no curve)."""
    leaves = entries if entries is not None else {"o1": GOOD_LEAF, "o2": GOOD_LEAF}
    return {"e": {"m": {"s": leaves}}, "c": {}, "d": None, "k": {"m": {"s": {"o1": curve}}}}


@pytest.mark.parametrize("secret", [None, SECRET])
def test_a_curve_travels_with_its_entry(secret: bytes | None) -> None:
    entry = ENTRY._replace(curve=CURVE)
    delta = st.Delta({("m", "m|a[0-9]", "t1"): entry, ("m", "m|b[0-9]", "t1"): ENTRY})
    message = codec("t2", secret).decode(codec("t1", secret).encode(delta, NOW), NOW)
    assert isinstance(message.body, st.Delta) and message.body == delta
    assert message.refused == message.refused_curves == 0


def test_a_delta_with_curves_keeps_the_shape_older_decoders_take() -> None:
    """Decoders that predate curves skip a body's unknown keys and require 8-field entry
    leaves and arrays of at most 8 (checked by hand against the decoder of 476a46b)."""
    entry = ENTRY._replace(curve=tuple((k, 1.0, 4.0) for k in range(8)))
    frame = codec("t1", None).encode(st.Delta({("m", "s", "t1"): entry}), NOW)
    body = msgpack.unpackb(msgpack.unpackb(frame)[6], max_array_len=8)
    # "f" (topology fingerprints of the change times, the clock-skew fix) is skipped alike
    assert len(body["e"]["m"]["s"]["t1"]) == 8 and set(body) == {"e", "c", "d", "f", "k"}
    body["z"] = {"anything": [1, 2]}  # a later field: skipped the same way
    message = codec("t2", None).decode(frame_of(GOOD_HEADER, body), NOW)
    assert isinstance(message.body, st.Delta)
    assert list(message.body.entries.values()) == [entry]
    without = st.Delta({("m", "s", "t1"): ENTRY})  # no curve: no "k"
    assert "k" not in msgpack.unpackb(msgpack.unpackb(codec("t1", None).encode(without, NOW))[6])


@pytest.mark.parametrize("curve", [
    [],  # no bin
    [[81, 1.0, 4.0]],  # bin beyond MAX_CURVE_BIN
    [[-1, 1.0, 4.0]],  # negative bin
    [[True, 1.0, 4.0]],  # a boolean bin
    [[1.5, 1.0, 4.0]],  # a fractional bin
    [[4, 1.0, 4.0], [0, 1.0, 4.0]],  # not ascending
    [[4, 1.0, 4.0], [4, 2.0, 4.0]],  # a bin twice
    [[0, -1.0, 4.0]],  # negative mass
    [[0, float("inf"), 4.0]],  # infinite mass
    [[0, 1e300, 4.0]],  # a mass that would swamp every other origin's
    [[0, 1.0, float("nan")]],  # NaN mean
    [[0, 1.0, float("-inf")]],  # infinite mean
    [[0, 1.0, 50.0]],  # e^50 tokens/s
    [[0, 1.0, "4.0"]],  # mean not a number
    [[0, 1.0]],  # a pair, not a triple
    [[0, 1.0, 4.0, 9]],  # four fields
    "curve",  # not a list
    [7],  # a bin that is not a list
])
def test_a_bad_curve_refuses_its_entry_counted_the_rest_kept(curve: object) -> None:
    message = codec("t2", None).decode(frame_of(GOOD_HEADER, curve_body(curve)), NOW)
    assert isinstance(message.body, st.Delta)
    assert message.refused_curves == 1 and message.refused == 0
    assert list(message.body.entries) == [("m", "s", "o2")]  # the other entry still applies
    if isinstance(curve, list) and all(isinstance(b, list) and len(b) == 3 for b in curve):
        bad = StatEntry(*GOOD_LEAF)._replace(curve=tuple(tuple(b) for b in curve))
        sent = codec("t1", None).decode(codec("t3", None).encode(
            st.Delta({("m", "s", "o1"): bad}), NOW), NOW)
        assert isinstance(sent.body, st.Delta)  # never put on the wire: the entry goes bare
        assert sent.refused_curves == 0 and sent.body.entries[("m", "s", "o1")].curve is None


def test_a_curve_without_its_entry_is_refused_and_counted() -> None:
    alone = curve_body(GOOD_CURVE, {"o2": GOOD_LEAF})
    message = codec("t2", None).decode(frame_of(GOOD_HEADER, alone), NOW)
    assert isinstance(message.body, st.Delta) and message.refused_curves == 1
    assert list(message.body.entries) == [("m", "s", "o2")]
    bad_entry = curve_body(GOOD_CURVE, {"o1": [-1.0, *GOOD_LEAF[1:]], "o2": GOOD_LEAF})
    message = codec("t2", None).decode(frame_of(GOOD_HEADER, bad_entry), NOW)
    assert isinstance(message.body, st.Delta)
    assert (message.refused, message.refused_curves) == (1, 1)


@pytest.mark.parametrize("curves", [
    [1, 2], {"m": {"s": []}}, {"m": {"": {"o1": GOOD_CURVE}}},
    # more than 8 bins: past the body's array limit (8), which bounds a frame's memory
    {"m": {"s": {"o1": [[k, 1.0, 4.0] for k in range(9)]}}},
])
def test_a_bad_curve_map_structure_is_malformed(curves: object) -> None:
    body = {**curve_body(GOOD_CURVE), "k": curves}
    with pytest.raises(err.MalformedMessage):
        codec("t2", None).decode(frame_of(GOOD_HEADER, body), NOW)


def test_a_full_delta_with_curves_fits_a_frame() -> None:
    """MAX_ENTRIES_PER_MESSAGE entries, each with 8 bins, ids of typical length."""
    entry = ENTRY._replace(curve=tuple((k, 12.345678, 4.56789) for k in range(8)))
    delta = st.Delta({("model-7b", f"model-7b|node-{i:04d}[0-39]", f"tracker-{i % 8}"): entry
                      for i in range(st.MAX_ENTRIES_PER_MESSAGE)})
    frame = codec().encode(delta, NOW)
    assert len(frame) < WireCodec("t2").max_frame_bytes
    assert codec("t2").decode(frame, NOW).body == delta
