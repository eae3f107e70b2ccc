"""Decayed per-origin statistics: EWMA, decay, staleness, pruning, merge (a CRDT)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshroute_middleware.core import RouteStatsStore, StatEntry
from meshroute_middleware.core.curves import MAX_CURVE_BIN, MAX_CURVE_BINS
from meshroute_middleware.core.kinds import STALE
from meshroute_middleware.core.stats import (
    MAX_NOTED_ORIGINS,
    State,
    decay_factor,
    merge_curves,
    merge_view,
)

from ..conftest import route_view, stat_keys

H = 600.0  # ADR-0021 default half-life, seconds
T0 = 1_000_000.0
KEY = ("m", "m|a[0-39]")

EWMA = [  # (samples as (seconds after T0, tps), view time after T0, value, mass)
    ([(0, 10.0)], 0, 10.0, 1.0),
    ([(0, 10.0), (0, 20.0)], 0, 15.0, 2.0),
    ([(0, 10.0), (H, 30.0)], H, (10 * 0.5 + 30) / 1.5, 1.5),  # m' = m·d + 1
    ([(0, 10.0), (2 * H, 30.0)], 2 * H, (10 * 0.25 + 30) / 1.25, 1.25),
    ([(0, 10.0)], H, 10.0, 0.5),  # decay moves mass, never the mean
    ([(0, 10.0)], 3 * H, 10.0, 0.125),
    ([(0, 10.0), (-H, 30.0)], 0, 20.0, 2.0),  # a clock step back decays nothing
]


@pytest.mark.parametrize(("samples", "at", "value", "mass"), EWMA)
def test_ewma_and_decay(samples: list[tuple[float, float]], at: float, value: float,
                        mass: float) -> None:
    store = RouteStatsStore("me", H)
    for dt, tps in samples:
        store.record_sample(*KEY, tps, 0.1, T0 + dt)
    view = route_view(store, *KEY, T0 + at)
    assert view.tps == pytest.approx(value, rel=1e-12)
    assert view.mass == pytest.approx(mass, rel=1e-12)
    assert view.count == len(samples)


@pytest.mark.parametrize(("dt", "factor"), [(0, 1.0), (-5, 1.0), (H, 0.5), (10 * H, 2**-10)])
def test_decay_factor(dt: float, factor: float) -> None:
    assert decay_factor(dt, H) == pytest.approx(factor, rel=1e-12)


STATUS = [  # (seconds after the sample, topology change time after T0 or None, status)
    (0.0, None, "proven"),
    (H, None, "proven"),  # mass exactly 0.5: still proven
    (1.01 * H, None, "decayed"),  # mass < 0.5 (ADR-0021)
    (5 * H, None, "decayed"),
    (10.0, 5.0, "stale"),  # a join/leave/shard change after the sample
    (10.0, 0.0, "proven"),  # a change at the very time of the sample is not after it
]


@pytest.mark.parametrize(("after", "changed", "status"), STATUS)
def test_status_transitions(after: float, changed: float | None, status: str) -> None:
    store = RouteStatsStore("me", H)
    store.record_sample(*KEY, 40.0, 0.2, T0)
    changed_at = -math.inf if changed is None else T0 + changed
    view = route_view(store, *KEY, T0 + after, changed_at)
    assert view.status == status
    if status == "stale":
        assert (view.tps, view.mass) == (40.0, 0.0)  # the old EWMA as a display prior only
    assert route_view(store, "m", "m|never", T0).status == "unsampled"


def test_stale_route_re_measured_is_proven_on_the_new_sample_alone() -> None:
    store = RouteStatsStore("me", H)
    store.record_sample(*KEY, 40.0, 0.2, T0)
    store.record_failure(*KEY, "timeout", T0 + 1)
    store.record_sample(*KEY, 10.0, 0.4, T0 + 20, changed_at=T0 + 10)
    view = route_view(store, *KEY, T0 + 20, T0 + 10)
    assert (view.status, view.tps, view.mass, view.count) == ("proven", 10.0, 1.0, 1)
    assert view.fail == pytest.approx(0.5 ** (19 / H)) and view.last_error == "timeout"


def test_failures_and_short_successes_are_no_tps_samples() -> None:
    store = RouteStatsStore("me", H)
    store.record_failure(*KEY, "http_5xx", T0)
    store.record_success(*KEY, T0)
    view = route_view(store, *KEY, T0)
    assert (view.status, view.tps, view.count, view.ok, view.fail) == (
        "unsampled", None, 0, 1.0, 1.0)


def test_pruning_after_24_hours() -> None:
    store = RouteStatsStore("me", H)
    store.record_sample(*KEY, 40.0, 0.2, T0)
    assert store.prune(T0 + 24 * 3600 - 1) == 0 and stat_keys(store) == [KEY]
    assert store.prune(T0 + 24 * 3600 + 1) == 1 and stat_keys(store) == []
    assert route_view(store, *KEY, T0 + 24 * 3600 + 1).status == "unsampled"


def test_merge_keeps_own_origin_and_takes_newer_foreign_entries() -> None:
    store = RouteStatsStore("me", H)
    mine = store.record_sample(*KEY, 40.0, 0.2, T0)
    foreign = {KEY: {"me": StatEntry(99.0, 9.0, T0 + 50),
                     "peer": StatEntry(20.0, 1.0, T0, count=1)}}
    assert store.merge(foreign) == 1
    assert store.entries(*KEY) == {"me": mine, "peer": foreign[KEY]["peer"]}
    assert store.merge(foreign) == 0  # idempotent
    assert store.merge({KEY: {"peer": StatEntry(5.0, 1.0, T0 - 1, count=1)}}) == 0  # older
    view = route_view(store, *KEY, T0)
    assert view.tps == pytest.approx(30.0) and view.origins == 2  # Σ m·v / Σ m
    old = {("m", "m|gone"): {"peer": StatEntry(1.0, 1.0, T0 - 25 * 3600, count=1)}}
    assert store.merge(old, now=T0) == 0  # pruned entries are not resurrected


finite = st.floats(-1e6, 1e6, allow_nan=False)
# Masses are 0 or ≥ 1e-100: 24 h of decay is 2^-144 ≈ 4e-44 and pruning comes then; subnormal
# masses would only measure the exact merge's own rounding.
masses = st.one_of(st.just(0.0), st.floats(1e-100, 100))
# Curve summaries as the wire admits them (finite, bins ascending); mostly none.
curves = st.one_of(st.none(), st.lists(
    st.tuples(st.integers(0, MAX_CURVE_BIN), st.floats(0, 200), st.floats(-13, 13)),
    min_size=1, max_size=MAX_CURVE_BINS, unique_by=lambda b: b[0]).map(lambda c: tuple(sorted(c))))
entries = st.builds(StatEntry, value=st.floats(0, 1e4), mass=masses,
                    t=st.floats(T0 - 5000, T0 + 5000), ttfb_s=st.floats(0, 10),
                    ok=st.floats(0, 100), fail=st.floats(0, 100), count=st.integers(0, 50),
                    last_error=st.sampled_from(["", "timeout", "connect"]), curve=curves)
states = st.dictionaries(st.tuples(st.sampled_from("mn"), st.sampled_from(["r1", "r2", "r3"])),
                         st.dictionaries(st.sampled_from(["x", "y", "z"]), entries, max_size=3),
                         max_size=4)


@settings(max_examples=200, deadline=None)
@given(states, states, states)
def test_merge_is_idempotent_commutative_associative(a: State, b: State, c: State) -> None:
    def merged(*parts: State) -> State:
        store = RouteStatsStore("self")  # an origin none of the states holds
        for part in parts:
            store.merge(part)
        return store.state()

    once = RouteStatsStore("self")
    once.merge(a)
    assert once.merge(a) == 0 and once.state() == merged(a) == merged(a, a, {})
    assert merged(a) == {k: dict(v) for k, v in a.items() if v}
    assert merged(a, b) == merged(b, a)
    assert merged(merged(a, b), c) == merged(a, merged(b, c))


@settings(max_examples=200, deadline=None)
@given(entries, finite, st.floats(1, 1e5))
def test_decay_never_increases_mass(entry: StatEntry, dt: float, half_life_s: float) -> None:
    later = entry.decayed(entry.t + dt, half_life_s)
    assert later.mass <= entry.mass and later.ok <= entry.ok and later.fail <= entry.fail
    assert entry.with_success(entry.t + dt, half_life_s).mass <= entry.mass
    assert entry.with_failure("x", entry.t + dt, half_life_s).mass <= entry.mass


@settings(max_examples=200, deadline=None)
@given(states, st.sampled_from(["x", "y"]))
def test_store_merge_never_changes_its_own_origin(received: dict, origin: str) -> None:
    store = RouteStatsStore(origin, H)
    for i, key in enumerate([("m", "r1"), ("n", "r2")]):
        store.record_sample(*key, 10.0 + i, 0.1, T0 + i)
    before = {key: store.entries(*key).get(origin) for key in [("m", "r1"), ("n", "r2")]}
    store.merge(received)
    for key, entry in before.items():
        assert store.entries(*key).get(origin) == entry
    assert all(origin not in store.entries(*key) for key in received if key not in before)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["x", "y", "z"]), entries, min_size=1),
       st.floats(T0 - 6000, T0 + 20000), st.floats(T0 - 6000, T0 + 6000))
def test_origins_and_staleness_need_no_merge(origins: dict[str, StatEntry], now: float,
                                            changed_at: float) -> None:
    """What a decision reads before any view (MergedRoute.origins / .stale) is what the exact
    merge says, at any time."""
    store = RouteStatsStore("me", H)
    store.merge({KEY: origins})
    merged = store.merged(*KEY, changed_at)
    exact = merge_view(origins.values(), now, changed_at, H)
    assert merged is not None
    assert merged.origins == exact.origins
    assert merged.stale == (exact.status == STALE)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(["x", "y", "z"]), entries, min_size=1),
       st.floats(T0 - 6000, T0 + 20000), st.floats(T0 - 6000, T0 + 6000))
def test_cached_view_equals_the_exact_merge(origins: dict[str, StatEntry], now: float,
                                            changed_at: float) -> None:
    store = RouteStatsStore("me", H)
    store.merge({KEY: origins})
    fast = route_view(store, *KEY, now, changed_at)
    exact = merge_view(origins.values(), now, changed_at, H)
    for got, want in zip(fast, exact, strict=True):
        if isinstance(want, float):
            # abs 1e-12: a tps of 1e-277 at a mass of 1e-45 multiplies into subnormal floats,
            # where the two summation orders differ by 0.1 % (found by hypothesis under load)
            assert got == pytest.approx(want, rel=1e-9, abs=1e-12)
        else:
            assert got == want


def test_an_origin_that_stamped_our_topology_is_judged_on_its_own_clock() -> None:
    """Clock skew (issue 15): the peer's clock is 5 s behind ours; it stamped the same join at
    T0 - 5 on its clock, we at T0 on ours. Its sample at T0 - 4 (its clock) came after the join,
    its sample at T0 - 6 before it: only the first counts, whatever our clock says."""
    store = RouteStatsStore("me", H)
    store.merge({KEY: {"peer": StatEntry(30.0, 1.0, T0 - 4, count=1)}})
    assert route_view(store, *KEY, T0 + 1, T0).status == STALE  # judged on our clock: wrongly stale
    assert store.note_origin_change("m", "peer", T0 - 5, ours=T0)
    view = route_view(store, *KEY, T0 + 1, T0)
    assert (view.status, view.tps, view.count) == ("proven", 30.0, 1)
    store.merge({KEY: {"late": StatEntry(20.0, 1.0, T0 - 6, count=1)}})
    store.note_origin_change("m", "late", T0 - 5, ours=T0)  # measured before its own stamp
    assert route_view(store, *KEY, T0 + 1, T0).count == 1  # stays stale: "late" is not counted


def test_an_origin_stamp_holds_only_while_our_topology_is_the_one_it_stamped() -> None:
    store = RouteStatsStore("me", H)
    store.merge({KEY: {"peer": StatEntry(30.0, 1.0, T0 - 4, count=1)}})
    store.note_origin_change("m", "peer", T0 - 5, ours=T0)
    assert route_view(store, *KEY, T0 + 1, T0 + 2).status == STALE  # we saw another change since
    assert not store.note_origin_change("m", "peer", T0 - 9, ours=T0)  # older: reordered
    assert not store.note_origin_change("m", "peer", T0 - 5, ours=None)  # not newer either
    assert store.note_origin_change("m", "peer", T0 - 3, ours=None)  # another topology
    assert route_view(store, *KEY, T0 + 1, T0).status == STALE  # judged on our change time again
    assert not store.note_origin_change("m", "me", T0 + 100, ours=T0)  # never our own origin


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([T0 - 5, T0, T0 + 3]),
                          st.sampled_from([None, T0, T0 + 2])), min_size=1, max_size=6),
       st.randoms(use_true_random=False))
def test_origin_stamps_are_order_independent(notes: list[tuple[float, float | None]],
                                             rng: random.Random) -> None:
    """Gossip delivers a peer's stamps in any order, duplicated: the same cut results."""
    views = []
    for order in (notes, rng.sample(notes, len(notes)), notes + notes[::-1]):
        store = RouteStatsStore("me", H)
        store.merge({KEY: {"peer": StatEntry(30.0, 1.0, T0 - 1, count=1)}})
        for changed_at, ours in order:
            store.note_origin_change("m", "peer", changed_at, ours)
        views.append(route_view(store, *KEY, T0 + 10, T0).status)
    assert views[0] == views[1] == views[2]


def test_origin_stamps_are_bounded_per_model() -> None:
    store = RouteStatsStore("me", H)
    for i in range(MAX_NOTED_ORIGINS):
        assert store.note_origin_change("m", f"o{i}", T0, ours=T0)
    assert not store.note_origin_change("m", "one-more", T0, ours=T0)
    assert store.note_origin_change("m", "o0", T0 + 1, ours=T0)  # a known one still updates


# -- curve summaries (issue 14) ----------------------------------------------------------------

CURVE_A = ((0, 4.0, math.log(100.0)), (4, 2.0, math.log(50.0)))
CURVE_B = ((0, 2.0, math.log(80.0)), (8, 1.0, math.log(20.0)))


def test_an_entry_keeps_its_curve_until_its_origin_writes_a_new_one() -> None:
    store = RouteStatsStore("me", H)
    entry = store.record_sample(*KEY, 10.0, 0.1, T0, curve=CURVE_A)
    assert entry.curve == CURVE_A
    assert store.record_sample(*KEY, 10.0, 0.1, T0 + 1).curve == CURVE_A  # none given: kept
    assert store.record_success(*KEY, T0 + 2).curve == CURVE_A
    assert store.record_failure(*KEY, "timeout", T0 + 3).curve == CURVE_A
    assert store.record_sample(*KEY, 10.0, 0.1, T0 + 4, curve=CURVE_B).curve == CURVE_B
    assert entry.decayed(T0 + H, H).curve == CURVE_A  # masses of the curve decay at merge
    # measured under an older topology: the curve goes with the tps
    assert store.record_success(*KEY, T0 + 5, changed_at=T0 + 5).curve is None


def test_of_two_copies_of_one_write_the_one_with_its_curve_wins() -> None:
    bare = StatEntry(10.0, 1.0, T0, count=1)
    curved = bare._replace(curve=CURVE_A)
    for first, second in ((bare, curved), (curved, bare)):
        store = RouteStatsStore("me", H)
        store.merge({KEY: {"peer": first}})
        store.merge({KEY: {"peer": second}})
        assert store.entries(*KEY)["peer"] == curved
    store = RouteStatsStore("me", H)  # different curves of one write: a total order decides
    store.merge({KEY: {"peer": bare._replace(curve=CURVE_B)}})
    assert store.merge({KEY: {"peer": curved}}) == 1  # CURVE_A > CURVE_B
    assert store.merge({KEY: {"peer": bare._replace(curve=CURVE_B)}}) == 0


def test_curves_merge_over_fresh_origins_by_decayed_mass() -> None:
    x = StatEntry(10.0, 1.0, T0, count=1, curve=CURVE_A)
    y = StatEntry(10.0, 1.0, T0 - H, count=1, curve=CURVE_B)  # half its mass left at T0
    old = StatEntry(10.0, 1.0, T0 - 10 * H, count=1, curve=((0, 9.0, 0.0),))
    merged = merge_curves([x, y, old, StatEntry(10.0, 1.0, T0, count=1)], T0,
                          changed_at=T0 - 5 * H, half_life_s=H)
    m0 = 4.0 + 2.0 * 0.5
    assert [b for b, _, _ in merged] == [0, 4, 8]
    assert merged[0][1] == pytest.approx(m0)
    assert merged[0][2] == pytest.approx((4.0 * math.log(100) + 1.0 * math.log(80)) / m0)
    assert merged[1] == pytest.approx((4, 2.0, math.log(50.0)))
    assert merged[2] == pytest.approx((8, 0.5, math.log(20.0)))
    store = RouteStatsStore("me", H)
    store.merge({KEY: {"x": x, "y": y, "old": old}})
    route = store.merged(*KEY, changed_at=T0 - 5 * H)
    assert route is not None
    assert [list(b) for b in route.curve] == [pytest.approx(list(b)) for b in merged]
    assert merge_curves([StatEntry(count=1)], T0, float("-inf"), H) == ()


@settings(max_examples=200, deadline=None)
@given(states, states)
def test_the_merged_curve_does_not_depend_on_the_order_of_merges(a: State, b: State) -> None:
    def curves(*parts: State) -> dict[tuple[str, str], object]:
        store = RouteStatsStore("self", H)
        for part in parts:
            store.merge(part)
        return {key: route.curve for key in store.state()
                if (route := store.merged(*key)) is not None}
    assert curves(a, b) == curves(b, a) == curves(a, b, a)
