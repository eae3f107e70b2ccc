"""The gossip decoder under hostile frames: a Message or a GossipError; what it lets through
is only what validated, and a signed codec lets nothing altered through."""

from __future__ import annotations

import random
from typing import Any

import msgpack
from hypothesis import given
from hypothesis import strategies as hs

from gossip import errors as err
from gossip import state as st
from gossip.stats_wire import sendable
from gossip.wire import WIRE_VERSION, MessageType, WireCodec
from meshroute_middleware.core import Router, RouterConfig
from meshroute_middleware.core.stats import StatEntry

from .strategies import FUZZ

NOW = 1_000_000.0
MSGPACK = hs.recursive(
    hs.none() | hs.booleans() | hs.integers(min_value=-2**63, max_value=2**64 - 1)
    | hs.floats() | hs.text(max_size=30) | hs.binary(max_size=30),
    lambda inner: hs.lists(inner, max_size=6)
    | hs.dictionaries(hs.text(max_size=20) | hs.sampled_from(["m", "m|a[0-9]", "t1", "e", "c",
                                                              "d", "x", "n"]), inner,
                      max_size=5), max_leaves=30)
NUMBER = (hs.floats() | hs.integers(min_value=-2**63, max_value=2**64 - 1)
          | hs.sampled_from([0.0, 1.0, NOW, NOW + 1e6, 1e9, 1e10, 2**53, 2**53 + 1]))
ENTRY = hs.tuples(*[NUMBER] * 7, hs.text(max_size=10) | hs.none()).map(list) | hs.lists(
    NUMBER | hs.none(), max_size=9)


def _frame(kind: int, body: Any, sender: Any = "peer", sent_at: Any = NOW) -> bytes:
    return msgpack.packb([WIRE_VERSION, kind, sender, sent_at, 1, 0,
                          msgpack.packb(body), None])


def _decode(codec: WireCodec, data: bytes) -> Any:
    try:
        return codec.decode(data, NOW)
    except err.GossipError as exc:
        assert str(exc) is not None
        return None


def _admits_only_valid(message: Any) -> None:
    """Whatever was decoded is applied to a real store: it holds only sendable entries."""
    if message is None or not isinstance(message.body, st.Delta):
        return
    router = Router(RouterConfig(), clock=lambda: NOW, rng=random.Random(0), origin="me")
    st.apply_delta(router.stats, router.topology, message.body, NOW, sender=message.sender,
                   relay=True)
    for _, origins in router.stats:
        for entry in origins.values():
            assert isinstance(entry, StatEntry) and sendable(entry)


@FUZZ
@given(hs.binary(max_size=400))
def test_random_bytes_are_refused_with_a_gossip_error(data: bytes) -> None:
    _admits_only_valid(_decode(WireCodec("me"), data))


@FUZZ
@given(hs.sampled_from([int(k) for k in MessageType]) | hs.integers(), MSGPACK,
       MSGPACK | hs.just("peer"), MSGPACK | hs.just(NOW))
def test_hostile_bodies_decode_or_are_refused(kind: int, body: Any, sender: Any,
                                              sent_at: Any) -> None:
    try:
        data = _frame(kind, body, sender, sent_at)
    except (OverflowError, ValueError, TypeError):
        return  # msgpack cannot even write it
    _admits_only_valid(_decode(WireCodec("me"), data))


@FUZZ
@given(hs.dictionaries(hs.sampled_from(["m", "n"]), hs.dictionaries(
    hs.sampled_from(["m|a[0-9]", "m|b[0-9]"]), hs.dictionaries(hs.sampled_from(["peer", "x"]),
                                                               ENTRY, max_size=2),
    max_size=2), max_size=2),
    hs.dictionaries(hs.text(max_size=4), hs.floats() | hs.integers(), max_size=3))
def test_near_valid_deltas_admit_only_valid_entries(entries: Any, changes: Any) -> None:
    try:
        data = _frame(int(MessageType.DELTA), {"e": entries, "c": changes})
    except OverflowError:
        return  # msgpack cannot even write it
    _admits_only_valid(_decode(WireCodec("me"), data))


@FUZZ
@given(hs.integers(min_value=0), hs.integers(min_value=0, max_value=255))
def test_a_signed_frame_altered_anywhere_is_refused(where: int, xor: int) -> None:
    sender, receiver = WireCodec("peer", b"k"), WireCodec("me", b"k")
    entry = StatEntry(value=20.0, mass=2.0, t=NOW, ttfb_s=0.1, ok=2.0, count=2)
    data = bytearray(sender.encode(st.Delta({("m", "m|a[0-9]", "peer"): entry}), NOW))
    data[where % len(data)] ^= xor or 1
    try:
        receiver.decode(bytes(data), NOW)
    except err.GossipError:
        return
    raise AssertionError("an altered signed frame was accepted")
