"""Saturation curves: the model's shapes, fitting them from samples, change detection."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from meshroute_middleware.core.saturation import (
    BIN_HALF_LIFE_SAMPLES,
    CURVES,
    KNEES,
    MAX_MASS,
    REFIT_SHARE,
    SUMMARY_BINS,
    CurveBelief,
    bin_of,
    log_g,
    prior_draw,
    slots_knee,
    throughput,
)


def test_the_curve_family_covers_serial_batching_and_saturation() -> None:
    # serial: a request shares the server with c - 1 others
    assert [math.exp(log_g(c, 1.0, 0.0)) for c in (1, 2, 4)] == pytest.approx([1, 1 / 2, 1 / 4])
    # batching without slowdown up to the knee, then queueing
    assert [math.exp(log_g(c, 4.0, 0.0)) for c in (1, 4, 8)] == pytest.approx([1, 1, 1 / 2])
    # per-neighbour slowdown
    assert math.exp(log_g(3, 8.0, 0.25)) == pytest.approx(1 / 1.5)
    assert throughput(0, 60.0, 4.0, 0.0) == 0.0
    assert throughput(6, 60.0, 4.0, 0.0) == pytest.approx(240.0)


@pytest.mark.parametrize(("knee", "slowdown"), CURVES)
def test_every_curve_has_a_concave_non_decreasing_throughput(knee: float,
                                                             slowdown: float) -> None:
    ts = [throughput(n, 50.0, knee, slowdown) for n in range(0, 40)]
    gains = [b - a for a, b in itertools.pairwise(ts)]
    assert all(g >= -1e-9 for g in gains)
    assert all(b <= a + 1e-9 for a, b in itertools.pairwise(gains))


def _feed(belief: CurveBelief, truth: tuple[float, float, float], rng: random.Random,
          n: int, sigma: float = 0.1, cs: tuple[float, ...] = (1, 2, 3, 4, 6, 8)) -> None:
    s1, knee, slowdown = truth
    for k in range(n):
        c = cs[k % len(cs)]
        belief.add(s1 * math.exp(log_g(c, knee, slowdown) + rng.gauss(0.0, sigma)), c)


@pytest.mark.parametrize("truth", [(50.0, 1.0, 0.0),  # serial
                                   (90.0, 16.0, 0.05),  # batching with room
                                   (90.0, 4.0, 0.25),  # a batch that saturates
                                   (60.0, 8.0, 0.0)])  # free batching up to 8 slots
def test_the_fit_recovers_the_throughput_curve(truth: tuple[float, float, float]) -> None:
    belief = CurveBelief()
    _feed(belief, truth, random.Random(1), 120)
    _, mus, best = belief.fit()
    knee, slowdown = CURVES[best]
    for n in range(1, 9):
        want = throughput(n, *truth)
        got = throughput(n, math.exp(mus[best]), knee, slowdown)
        # 120 samples with sigma 0.1 (log): the fitted curve's total throughput is within 8 %
        # at every concurrency it was sampled near (the grid itself is coarser than that).
        assert got == pytest.approx(want, rel=0.08), (n, CURVES[best])


def test_a_change_is_detected_within_a_handful_of_samples() -> None:
    belief = CurveBelief()
    rng = random.Random(2)
    _feed(belief, (60.0, 8.0, 0.05), rng, 200)
    before = belief.changes  # a false alarm here is rare (~3 per 100,000 samples), not wrong
    _feed(belief, (30.0, 8.0, 0.05), rng, 5)  # halved: 0.69 in log, ~7 sigma per sample
    assert belief.changes == before + 1
    _feed(belief, (30.0, 8.0, 0.05), rng, 7)
    _, mus, best = belief.fit()  # the best fit's log tps with one request in flight
    assert math.exp(mus[best]) == pytest.approx(30.0, rel=0.1)


def test_the_cached_posterior_is_redone_when_samples_call_for_it() -> None:
    """A decision reads `posterior()` (the fit, its sigma and cumulative weights) from a cache.
    It must be the fit of the samples as they are after every sample that calls for a refit
    (each one while few are known, past REFIT_SHARE of the mass later) and after a change:
    a belief fed the same samples and fitted only at the end (no cache) is the reference."""
    rng = random.Random(11)
    samples = [(60.0 * math.exp(log_g(c, 4.0, 0.1) + rng.gauss(0.0, 0.1)), c)
               for c in (1.0, 2.0, 3.0, 4.0, 6.0) * 30]
    belief = CurveBelief()
    refits = kept = 0
    for k, (tps, c) in enumerate(samples):
        before = belief.posterior()
        belief.add(tps, c)
        fresh = CurveBelief()
        for x, y in samples[:k + 1]:
            fresh.add(x, y)
        if belief.posterior() is before:  # kept: only while the samples since stay few
            kept += 1
            assert belief.mass >= 1.0 / REFIT_SHARE and kept <= REFIT_SHARE * belief.mass
        else:
            refits, kept = refits + 1, 0
            assert belief.posterior() == fresh.posterior()
            assert belief.fit() == fresh.posterior()[:3]
            assert belief.spread() == fresh.posterior()[3]
            draws = random.Random(k), random.Random(k)
            assert ([belief.draw(draws[0]) for _ in range(20)]
                    == [fresh.draw(draws[1]) for _ in range(20)])
    assert refits > 30 and kept > 0  # both paths taken: every sample early, 1 in ~8 later
    # A change forgets the old level: the very next posterior is the new one's.
    for _ in range(20):
        belief.add(15.0, 1.0)
        if belief.changes:
            break
    assert belief.changes == 1
    _, mus, best, _ = belief.posterior()
    assert math.exp(mus[best]) == pytest.approx(15.0, rel=0.01)


def test_no_false_alarm_on_a_stationary_noisy_route() -> None:
    belief = CurveBelief()
    # 3,000 samples with sigma 0.3: the CUSUM at h = 6 sigma should almost never fire (its
    # average run length at k = 0.5 is in the tens of thousands); allow one.
    _feed(belief, (40.0, 4.0, 0.1), random.Random(3), 3000, sigma=0.3)
    assert belief.changes <= 1


def test_masses_are_capped_and_decay() -> None:
    belief = CurveBelief()
    _feed(belief, (40.0, 1.0, 0.0), random.Random(4), 500)
    assert belief.mass == pytest.approx(200.0)
    belief.decay(0.5)
    assert belief.mass == pytest.approx(100.0)
    assert sum(m for _, _, m in belief.concurrencies()) == pytest.approx(100.0)


def test_concurrency_bins_are_quarter_octaves() -> None:
    assert [bin_of(c) for c in (0.5, 1.0, 1.19, 2.0, 4.0)] == [0, 0, 1, 4, 8]


WIDE = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32)  # 10 bins visited: a summary must merge some


@pytest.mark.parametrize("truth", [(50.0, 1.0, 0.0), (90.0, 16.0, 0.05), (90.0, 4.0, 0.25),
                                   (60.0, 8.0, 0.0), (90.0, 2.0, 0.1)])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_summary_carries_the_curve_to_a_belief_built_from_it(
        truth: tuple[float, float, float], seed: int) -> None:
    """What gossip shares (issue 14): at most 8 bins, ascending, masses as the fit weighs
    them; a belief fitted to them predicts the route's throughput nearly as well as one
    fitted to every sample."""
    belief = CurveBelief()
    _feed(belief, truth, random.Random(seed), 120, cs=WIDE)
    summary = belief.summary()
    keys = [b for b, _, _ in summary]
    assert len(belief.bins) > len(summary) == SUMMARY_BINS and keys == sorted(set(keys))
    assert keys[0] == 0  # the speed alone (one request) survives the merging
    faded = sum(b.mass * 0.5 ** ((belief.samples - b.last) / BIN_HALF_LIFE_SAMPLES)
                for b in belief.bins.values())
    assert sum(m for _, m, _ in summary) == pytest.approx(faded)  # merged, never dropped
    copy = CurveBelief.from_summary(summary)
    _, mus, best = copy.fit()
    for n in range(1, 9):
        want = throughput(n, *truth)
        got = throughput(n, math.exp(mus[best]), *CURVES[best])
        # every sample fitted: within 13 % on these seeds; the summary: within 15 %
        assert got == pytest.approx(want, rel=0.15)
    assert copy.spread() == pytest.approx(0.3, rel=0.2)  # a summary's spread: OBS_SIGMA


def test_a_summary_s_mass_is_capped_and_empty_bins_dropped() -> None:
    belief = CurveBelief.from_summary([(0, 300.0, 4.0), (4, 100.0, 3.5), (8, 0.0, 3.0)])
    assert belief.mass == pytest.approx(MAX_MASS) and sorted(belief.bins) == [0, 4]
    assert belief.bins[0].mass == pytest.approx(150.0)
    assert CurveBelief().summary() == ()


# -- announced slots: a prior for the knee (issue 26) ------------------------------------------
def test_announced_slots_name_the_grid_knee_where_queueing_begins() -> None:
    def knee(slots: int | None) -> float | None:
        k = slots_knee(slots)
        return KNEES[k - 1] if k else None

    assert [knee(s) for s in (None, 1, 2, 4, 5, 8, 9, 16, 32)] == [
        None, 1.0, 2.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0]
    assert knee(33) is None and knee(65536) is None  # past what the grid tells apart


def test_a_belief_with_no_samples_draws_mostly_the_announced_knee() -> None:
    rng, belief = random.Random(5), CurveBelief()
    belief.set_knee(slots_knee(4))
    drawn = [CURVES[belief.draw(rng)][0] for _ in range(4000)]
    assert drawn.count(4.0) / len(drawn) > 0.6  # 1 / (1 + 3 e^-2 + 6 e^-7) = 0.71
    assert sum(k > 4.0 for k in drawn) / len(drawn) < 0.01  # batching more than it says
    assert CURVES[belief.fit()[2]][0] == 4.0  # and the MAP is there
    # A route measured by nobody (no belief at all) draws from the same prior.
    alone = [CURVES[prior_draw(rng, slots_knee(4))][0] for _ in range(4000)]
    assert alone.count(4.0) / len(alone) > 0.6
    assert sum(k > 4.0 for k in alone) / len(alone) < 0.01


def test_samples_overrule_an_announcement_they_contradict() -> None:
    # A node says 4 slots but its server batches 16 (say vLLM with a larger --max-num-seqs):
    # after samples at 1-12 in flight with no queueing the posterior has left the knee of 4.
    belief = CurveBelief()
    belief.set_knee(slots_knee(4))
    _feed(belief, (90.0, 16.0, 0.02), random.Random(2), 60, cs=(1, 2, 4, 6, 8, 12))
    assert CURVES[belief.fit()[2]][0] >= 12.0
    # One that says 4 and does queue past 4 keeps it.
    told = CurveBelief()
    told.set_knee(slots_knee(4))
    _feed(told, (90.0, 4.0, 0.25), random.Random(2), 60)
    assert CURVES[told.fit()[2]][0] == 4.0


def test_without_an_announcement_the_posterior_is_exactly_as_before() -> None:
    plain, told = CurveBelief(), CurveBelief()
    told.set_knee(slots_knee(None))
    for belief in (plain, told):
        _feed(belief, (60.0, 8.0, 0.1), random.Random(4), 50)
    assert told.posterior() == plain.posterior()
    # Setting a knee refits; setting it back gives the flat prior's fit again.
    before = plain.posterior()
    plain.set_knee(slots_knee(4))
    assert plain.posterior() != before
    plain.set_knee(0)
    assert plain.posterior() == before
