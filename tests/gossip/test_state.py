"""gossip.state: digests, deltas and their merge form a state-based CRDT."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from gossip import state as st
from gossip.stats_wire import sendable
from meshroute_middleware.core.stats import RouteStatsStore, StatEntry
from meshroute_middleware.core.topology import NodeRecord, Topology

from ..conftest import route_view

NOW = 1_000_000.0
KEYS = [(m, s, o) for m in ("m1", "m2") for s in ("s1", "s2") for o in ("o1", "o2", "o3")]

entries = hs.builds(
    StatEntry,
    value=hs.sampled_from([10.0, 20.0, 55.5]),
    mass=hs.sampled_from([0.5, 1.0, 3.0]),
    t=hs.sampled_from([NOW - 30, NOW - 10, NOW]),  # few values: ties are common
    count=hs.integers(1, 5),
    ttfb_s=hs.sampled_from([0.0, 0.2]),
    ok=hs.sampled_from([0.0, 2.0]),
    fail=hs.sampled_from([0.0, 1.0]),
    last_error=hs.sampled_from(["", "timeout"]),
    curve=hs.sampled_from([None, ((0, 1.0, 4.0),), ((0, 1.0, 4.1),),
                           ((0, 1.0, 4.0), (4, 2.0, 3.5))]),  # few: ties with other curves
)
states = hs.dictionaries(hs.sampled_from(KEYS), entries, max_size=len(KEYS))


def apply(store: RouteStatsStore, topology: Topology, delta: st.Delta, now: float, *,
          sender: str = "peer", relay: bool = True) -> st.ApplyResult:
    """apply_delta from an authenticated peer (relayed entries allowed) unless told otherwise."""
    return st.apply_delta(store, topology, delta, now, sender=sender, relay=relay)


def make(store: RouteStatsStore, topology: Topology, peer: st.Digest, *, relay: bool = True,
         include_digest: bool = False) -> st.Delta:
    """make_delta with the wire's own entry check."""
    return st.make_delta(store, topology, peer, sendable=sendable, relay=relay,
                         include_digest=include_digest)


def store_with(flat: dict[st.EntryKey, StatEntry], origin: str = "me") -> RouteStatsStore:
    store = RouteStatsStore(origin)
    for (model, sig, o), entry in flat.items():
        store.merge({(model, sig): {o: entry}}, NOW)
    return store


def full_delta(flat: dict[st.EntryKey, StatEntry]) -> st.Delta:
    return st.Delta(dict(flat))


def received(*flats: dict[st.EntryKey, StatEntry]) -> dict[st.EntryKey, StatEntry]:
    """What a fresh tracker holds after applying the given deltas in order."""
    store, topo = RouteStatsStore("me"), Topology()
    for flat in flats:
        apply(store, topo, full_delta(flat), NOW)
    return st.flat_entries(store)


@given(states)
def test_apply_is_idempotent(a: dict[st.EntryKey, StatEntry]) -> None:
    assert received(a, a) == received(a)


@given(states, states)
def test_apply_is_commutative(a: dict[st.EntryKey, StatEntry],
                              b: dict[st.EntryKey, StatEntry]) -> None:
    assert received(a, b) == received(b, a)


@given(states, states, states)
def test_apply_is_associative(a: dict[st.EntryKey, StatEntry], b: dict[st.EntryKey, StatEntry],
                              c: dict[st.EntryKey, StatEntry]) -> None:
    ab = received(a, b)
    bc = received(b, c)
    assert received(ab, c) == received(a, bc) == received(a, b, c)


@given(hs.lists(hs.floats(1.0, 500.0), min_size=1, max_size=12), hs.randoms(use_true_random=False),
       hs.floats(0.0, 0.5))
def test_duplicated_reordered_lost_messages_never_double_count(
        samples: list[float], rnd: random.Random, loss: float) -> None:
    origin = RouteStatsStore("o1")
    snapshots = []
    for i, tps in enumerate(samples):
        origin.record_sample("m", "s", tps, 0.1, NOW + i)
        snapshots.append(st.flat_entries(origin))
    messages = [s for s in snapshots for _ in range(rnd.randint(1, 3))]  # duplicates
    rnd.shuffle(messages)  # reordered
    kept = [m for m in messages if rnd.random() >= loss] + [snapshots[-1]]  # lost, then resent
    rnd.shuffle(kept)
    store = store_with({})
    for m in kept:
        apply(store, Topology(), full_delta(m), NOW + len(samples))
    now = NOW + len(samples)
    # the same mass: counted once
    assert route_view(store, "m", "s", now) == route_view(origin, "m", "s", now)


def push_pull(a: tuple[RouteStatsStore, Topology], b: tuple[RouteStatsStore, Topology]) -> int:
    """One exchange as the service does it, without the wire; return entries carried."""
    reply = make(b[0], b[1], st.make_digest(a[0], a[1]), include_digest=True)
    apply(a[0], a[1], reply, NOW)
    assert reply.digest is not None
    push = make(a[0], a[1], reply.digest)
    apply(b[0], b[1], push, NOW)
    return len(reply.entries) + len(push.entries)


@settings(max_examples=50)
@given(hs.integers(2, 8), hs.lists(hs.tuples(hs.integers(0, 7), hs.integers(0, 7)), max_size=30),
       hs.randoms(use_true_random=False))
def test_any_exchange_schedule_then_a_sweep_converges(n: int, pairs: list[tuple[int, int]],
                                                      rnd: random.Random) -> None:
    trackers = [(RouteStatsStore(f"t{i}"), Topology()) for i in range(n)]
    for i, (store, _) in enumerate(trackers):
        for sig in ("s1", "s2"):
            store.record_sample("m", sig, rnd.uniform(5, 100), 0.1, NOW - rnd.randint(0, 50))
        del i
    for x, y in pairs:
        if x % n != y % n:
            push_pull(trackers[x % n], trackers[y % n])
    for i in range(1, n):  # a sweep through tracker 0 connects everyone
        push_pull(trackers[0], trackers[i])
    for i in range(1, n):
        push_pull(trackers[0], trackers[i])
    states_seen = [st.flat_entries(s) for s, _ in trackers]
    assert all(s == states_seen[0] for s in states_seen)
    assert len(states_seen[0]) == 2 * n
    assert push_pull(trackers[0], trackers[1]) == 0  # converged: digests only, no entries


def test_equal_t_with_different_contents_still_converges() -> None:
    a, b = store_with({("m", "s", "o"): StatEntry(10.0, 1.0, NOW, count=1)}, "a"), store_with(
        {("m", "s", "o"): StatEntry(20.0, 1.0, NOW, count=1)}, "b")
    push_pull((a, Topology()), (b, Topology()))
    assert st.flat_entries(a) == st.flat_entries(b)
    assert st.flat_entries(a)[("m", "s", "o")].value == 20.0  # the core's total order decides


def test_own_origin_is_never_overwritten() -> None:
    store = RouteStatsStore("me")
    store.record_sample("m", "s", 50.0, 0.1, NOW)
    forged = {("m", "s", "me"): StatEntry(1.0, 99.0, NOW + 1, count=9)}
    result = apply(store, Topology(), full_delta(forged), NOW)
    assert (result.applied, result.ignored) == (0, 1)
    assert store.entries("m", "s")["me"].value == 50.0


def test_future_entries_are_refused_and_old_ones_not_resurrected() -> None:
    store = RouteStatsStore("me")
    delta = full_delta({("m", "s", "a"): StatEntry(1.0, 1.0, NOW + st.MAX_SKEW_S + 1, count=1),
                        ("m", "s", "b"): StatEntry(1.0, 1.0, NOW - 25 * 3600, count=1),
                        ("m", "s", "c"): StatEntry(1.0, 1.0, NOW, count=1)})
    result = apply(store, Topology(), delta, NOW)
    assert (result.applied, result.ignored, result.refused) == (1, 1, {st.FUTURE: 1})
    assert set(store.entries("m", "s")) == {"c"}


def test_origins_per_route_are_capped(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(st, "MAX_ORIGINS_PER_ROUTE", 2)
    store = RouteStatsStore("me")
    delta = full_delta({("m", "s", f"o{i}"): StatEntry(1.0, 1.0, NOW, count=1) for i in range(4)})
    result = apply(store, Topology(), delta, NOW)
    assert (result.applied, result.refused) == (2, {st.ROUTE_FULL: 2})


def test_entries_taken_from_gossip_are_capped_store_wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(st, "MAX_STORE_ENTRIES", 3)
    store = RouteStatsStore("me")
    delta = full_delta({("m", f"s{i}", "o"): StatEntry(1.0, 1.0, NOW, count=1) for i in range(5)})
    assert apply(store, Topology(), delta, NOW).refused == {st.STORE_FULL: 2}
    newer = full_delta({("m", "s0", "o"): StatEntry(2.0, 1.0, NOW + 1, count=2)})
    assert apply(store, Topology(), newer, NOW).applied == 1  # updates still flow


def test_delta_is_bounded_newest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(st, "MAX_ENTRIES_PER_MESSAGE", 3)
    flat = {("m", f"s{i}", "o"): StatEntry(1.0, 1.0, NOW - i, count=1) for i in range(5)}
    delta = make(store_with(flat), Topology(), st.Digest())
    assert sorted(k[1] for k in delta.entries) == ["s0", "s1", "s2"]


def test_delta_sends_only_what_the_peer_lacks_or_holds_older() -> None:
    old, new = StatEntry(1.0, 1.0, NOW - 5, count=1), StatEntry(2.0, 1.0, NOW, count=2)
    mine = store_with({("m", "s", "a"): new, ("m", "s", "b"): old, ("m", "s", "c"): old})
    peer = st.Digest({("m", "s", "a"): st.version(old), ("m", "s", "b"): st.version(old),
                      ("m", "s", "c"): st.version(new)})
    assert set(make(mine, Topology(), peer).entries) == {("m", "s", "a")}


def node(node_id: str) -> NodeRecord:
    return NodeRecord(node_id, "m", 0, 9, 10, "http://127.0.0.1:1")


def test_topology_change_times_travel_to_known_models_only() -> None:
    mine, theirs = Topology(), Topology()
    mine.upsert(node("a"), NOW - 100)
    theirs.upsert(node("a"), NOW - 100)
    theirs.upsert(node("b"), NOW - 10)
    delta = make(RouteStatsStore("x"), theirs, st.make_digest(RouteStatsStore("y"), mine))
    assert delta.changes == {"m": NOW - 10}
    result = apply(RouteStatsStore("y"), mine, delta, NOW)
    model = mine.model("m")
    assert result.changes == 1 and model is not None and model.changed_at == NOW - 10
    unknown = st.Delta(changes={"ghost": NOW})
    assert apply(RouteStatsStore("y"), mine, unknown, NOW).changes == 0
    assert mine.model("ghost") is None


@settings(max_examples=200, deadline=None)
@given(hs.floats(-5.0, 5.0), hs.floats(-5.0, 5.0), hs.floats(-10.0, 10.0))
def test_skewed_clocks_never_turn_a_sample_stale_or_fresh(skew_a: float, skew_b: float,
                                                          sampled: float) -> None:
    """Issue 15, clocks ±5 s apart: trackers a and b see the same join at real time NOW and
    stamp it on their own clocks; a measures `sampled` s after it (real time). After a full
    exchange both ways, the sample is fresh on both iff it was taken after the join, and no
    one adopts the other's stamp of the same change as a change of its own."""
    if abs(sampled) < 1e-6:
        return  # at the very instant of the change: either answer is right
    a_store, b_store = RouteStatsStore("a"), RouteStatsStore("b")
    a_topo, b_topo = Topology(), Topology()
    a_topo.upsert(node("n"), NOW + skew_a)
    b_topo.upsert(node("n"), NOW + skew_b)
    a_changed = a_topo.model("m").changed_at  # type: ignore[union-attr]
    a_store.record_sample("m", "m|n", 40.0, 0.1, NOW + sampled + skew_a, a_changed)
    a_now, b_now = NOW + 20 + skew_a, NOW + 20 + skew_b
    for (src, s_topo, s_name), (dst, d_topo, d_now) in (
            ((a_store, a_topo, "a"), (b_store, b_topo, b_now)),
            ((b_store, b_topo, "b"), (a_store, a_topo, a_now))):
        digest = st.make_digest(src, s_topo)
        st.note_changes(dst, d_topo, digest.changes, digest.shapes, d_now, sender=s_name)
        apply(dst, d_topo, make(src, s_topo, st.make_digest(dst, d_topo)), d_now, sender=s_name)
    assert a_topo.model("m").changed_at == a_changed  # type: ignore[union-attr]
    for store, topo, now in ((a_store, a_topo, a_now), (b_store, b_topo, b_now)):
        view = route_view(store, "m", "m|n", now, topo.model("m").changed_at)  # type: ignore[union-attr]
        assert view.status == ("proven" if sampled > 0 else "stale"), (store.origin, view)
