"""gossip.wire: round trips, authentication, replay, limits, hostile bytes."""

from __future__ import annotations

import contextlib

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from gossip import errors as err
from gossip import state as st
from gossip.wire import WIRE_VERSION, Ack, Challenges, MessageType, WireCodec, sendable
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
    assert {m.name: m.value for m in MessageType} == {"DIGEST": 1, "DELTA": 2, "ACK": 3}


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
        assert not sendable(StatEntry._make(leaf))


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


shaped = hs.fixed_dictionaries({"e": hs.dictionaries(hs.text(max_size=3), hs.dictionaries(
    hs.text(max_size=3), hs.dictionaries(hs.text(max_size=3), leaves, max_size=2), max_size=2),
    max_size=2), "c": leaves, "d": leaves | hs.fixed_dictionaries({"v": leaves, "c": leaves})})


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
