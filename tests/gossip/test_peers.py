"""gossip.peers: addresses, membership, fanout and backoff."""

from __future__ import annotations

import random

import pytest

from gossip.peers import BACKOFF_MAX_S, Membership, parse_address


@pytest.mark.parametrize("text,address", [
    ("127.0.0.1:7946", ("127.0.0.1", 7946)),
    ("tracker-b.local:1", ("tracker-b.local", 1)),
    ("[::1]:7946", ("::1", 7946)),
    (" host:65535 ", ("host", 65535)),
])
def test_parse_address(text: str, address: tuple[str, int]) -> None:
    assert parse_address(text) == address


@pytest.mark.parametrize("text", ["host", ":80", "host:", "host:0", "host:65536", "host:http",
                                  "[]:80", "host:-1"])
def test_parse_address_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse_address(text)


def test_peers_are_added_removed_and_never_ourselves() -> None:
    m = Membership((("a", 1), ("b", 1)), own=("me", 1))
    assert m.add_peer("c", 1) and not m.add_peer("a", 1) and not m.add_peer("me", 1)
    assert m.remove_peer("a", 1) and not m.remove_peer("zz", 1)
    assert m.peers() == [("b", 1), ("c", 1)]
    state = m.state(("b", 1))
    assert state is not None and state.static
    state = m.state(("c", 1))
    assert state is not None and not state.static


def test_pick_is_a_seeded_sample_of_distinct_peers() -> None:
    m = Membership(tuple((f"p{i}", 1) for i in range(10)))
    picks = [m.pick(3, 0.0, random.Random(5)) for _ in range(2)]
    assert picks[0] == picks[1] and len(set(picks[0])) == 3
    assert len(m.pick(30, 0.0, random.Random(5))) == 10
    assert m.pick(0, 0.0, random.Random(5)) == []


def test_pick_covers_every_peer_uniformly() -> None:
    """3 of 10 per round over 3000 rounds: each peer picked 900 times ± 10 %."""
    m = Membership(tuple((f"p{i}", 1) for i in range(10)))
    rng = random.Random(11)
    counts: dict[tuple[str, int], int] = {}
    for _ in range(3000):
        for p in m.pick(3, 0.0, rng):
            counts[p] = counts.get(p, 0) + 1
    assert all(abs(c - 900) < 90 for c in counts.values()) and len(counts) == 10


def test_a_dead_peer_backs_off_exponentially_and_recovers() -> None:
    m = Membership((("dead", 1), ("live", 1)))
    delays = [m.mark_failed(("dead", 1), 100.0) for _ in range(10)]
    assert delays[:4] == [1.0, 2.0, 4.0, 8.0] and delays[-1] == BACKOFF_MAX_S
    assert m.pick(2, 100.0 + BACKOFF_MAX_S - 1, random.Random(0)) == [("live", 1)]
    assert ("dead", 1) in m.pick(2, 100.0 + BACKOFF_MAX_S, random.Random(0))
    m.mark_ok(("dead", 1))
    state = m.state(("dead", 1))
    assert state is not None and state.failures == 0
    assert m.mark_failed(("dead", 1), 0.0) == 1.0
