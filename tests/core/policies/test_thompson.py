"""The thompson policy: scouting, goodput draws, reliability, load awareness, drift."""

from __future__ import annotations

import math
import random

import pytest

from meshroute_middleware.core import Arm, NodeRecord, Outcome, Router, RouterConfig, RouteView
from meshroute_middleware.core.policies.thompson import ThompsonPolicy
from meshroute_middleware.core.routes import Hop, make_route

DRAWS = 2000
UNSAMPLED = RouteView(None, 0.0, None, 0.0, 0.0, 0, "unsampled", 0)


def arm(name: str, prior: float = 10.0, in_flight: int = 0,
        view: RouteView = UNSAMPLED) -> Arm:
    node = NodeRecord(name, "m", 0, 31, 32, f"http://{name}.test", prior)
    return Arm(make_route("m", [Hop(node, 0, 31)]), view, in_flight)


def teach(policy: ThompsonPolicy, a: Arm, tps: float, n: int, now: float = 0.0,
          fail_every: int = 0) -> None:
    """Feed n outcomes of 300 tokens at `tps` (every `fail_every`-th one a failure)."""
    for k in range(n):
        if fail_every and k % fail_every == 0:
            policy.observe(a.signature, Outcome(error="stream"), now)
        else:
            policy.observe(a.signature, Outcome(300, 300 / tps), now)


def shares(policy: ThompsonPolicy, arms: list[Arm], now: float = 0.0,
           seed: int = 3) -> list[float]:
    rng, counts = random.Random(seed), [0] * len(arms)
    for _ in range(DRAWS):
        counts[policy.choose(arms, now, rng)[0]] += 1
    return [c / DRAWS for c in counts]


def test_untried_arms_are_scouted_first_best_prior_first() -> None:
    policy = ThompsonPolicy()
    arms = [arm("a", 10.0), arm("b", 30.0), arm("c", 20.0)]
    assert policy.choose(arms, 0.0, random.Random(1)) == (1, "greedy-fallback")  # cold start
    teach(policy, arms[1], 30.0, 1)
    assert policy.choose(arms, 0.0, random.Random(1)) == (2, "scout")


def test_an_arm_in_flight_is_not_scouted_twice() -> None:
    policy = ThompsonPolicy()
    arms = [arm("a", 10.0), arm("b", 30.0, in_flight=1)]
    assert policy.choose(arms, 0.0, random.Random(1)) == (0, "scout")  # b is being measured


def test_learns_the_faster_route() -> None:
    policy = ThompsonPolicy()
    arms = [arm("fast"), arm("slow")]
    teach(policy, arms[0], 60.0, 20)
    teach(policy, arms[1], 40.0, 20)
    # log(60/40) = 0.41 against a posterior spread of ~0.03: the slow arm is all but never
    # drawn; 0.99 leaves room for ~20 of 2,000 draws.
    assert shares(policy, arms)[0] >= 0.99


def test_choices_are_deterministic_given_the_rng() -> None:
    def run() -> list[int]:
        policy = ThompsonPolicy()
        arms = [arm("a"), arm("b"), arm("c")]
        for a, tps in zip(arms, (50.0, 48.0, 46.0), strict=True):
            teach(policy, a, tps, 3)
        rng = random.Random(11)
        return [policy.choose(arms, 0.0, rng)[0] for _ in range(200)]
    first = run()
    assert first == run()
    assert len(set(first)) > 1  # close arms: the draws really explore


def test_a_failing_route_loses_to_a_slightly_slower_reliable_one() -> None:
    policy = ThompsonPolicy()
    arms = [arm("flaky"), arm("steady")]
    teach(policy, arms[0], 60.0, 40, fail_every=5)  # 20 % failures: goodput ~48 tok/s
    teach(policy, arms[1], 56.0, 40)
    # Goodput 48 against 56 (log gap 0.15) with reliability sd ~0.06 on the flaky arm: it
    # wins ~2 % of these seeded draws; 0.95 leaves room for twice that and more.
    assert shares(policy, arms)[1] >= 0.95


def test_load_aware_choice_spreads_over_equal_routes() -> None:
    policy = ThompsonPolicy()
    a, b = arm("a"), arm("b")
    teach(policy, a, 50.0, 30)
    teach(policy, b, 50.0, 30)
    busy = [arm("a", in_flight=3), arm("b", in_flight=0)]
    # Expected delay 4/50 against 1/50: a log gap of 1.4 against a spread of ~0.03.
    assert shares(policy, busy)[1] >= 0.99
    # A twice-as-fast route is still preferred with one request in flight (2/100 < 1/40).
    teach(policy, a, 100.0, 60)
    teach(policy, b, 40.0, 60)
    assert shares(policy, [arm("a", in_flight=1), arm("b")])[0] >= 0.95


def test_change_detector_relearns_a_route_that_halves_its_speed() -> None:
    policy = ThompsonPolicy()
    a = arm("a")
    teach(policy, a, 60.0, 150)
    belief = policy.belief(a.signature)
    assert belief is not None
    teach(policy, a, 30.0, 8)
    # Without the detector the capped EWMA (mass 150) would still read ~57 tok/s after eight
    # samples at 30; with it the old mass is cut to 3 and the estimate is below 40 ...
    assert math.exp(belief.mean_log_tps) < 40.0
    teach(policy, a, 30.0, 12)
    # ... and within 10 % of the new speed after twenty.
    assert math.exp(belief.mean_log_tps) == pytest.approx(30.0, rel=0.1)


def test_time_decay_reopens_a_route_not_in_use() -> None:
    policy = ThompsonPolicy(half_life_s=600.0)
    slow, fast = arm("slow"), arm("fast")
    teach(policy, slow, 35.0, 30)
    teach(policy, fast, 50.0, 100)
    assert shares(policy, [slow, fast])[0] <= 0.01
    for k in range(1, 201):  # twenty half-lives of traffic on the fast route only
        teach(policy, fast, 50.0, 1, now=60.0 * k)
    # The slow route's mass is now ~30e-6: its spread is back at a never-seen route's (0.7)
    # and its draw beats the fast one's (log gap 0.36) in ~27 % of these seeded draws,
    # against none before; 0.05 is the floor that proves it is re-opened.
    assert shares(policy, [slow, fast], now=12000.0)[0] >= 0.05


def test_a_stale_view_caps_the_mass_of_old_beliefs() -> None:
    policy = ThompsonPolicy()
    a = arm("a")
    teach(policy, a, 50.0, 100)
    stale = RouteView(50.0, 0.0, None, 0.0, 0.0, 0, "stale", 1)
    tight = [ThompsonPolicy._belief_score(policy.belief(a.signature), a, 0.0,  # type: ignore[arg-type]
                                          600.0, random.Random(k).gauss) for k in range(300)]
    loose = [ThompsonPolicy._belief_score(policy.belief(a.signature), arm("a", view=stale),  # type: ignore[arg-type]
                                          0.0, 600.0, random.Random(k).gauss) for k in range(300)]
    spread = lambda xs: max(xs) - min(xs)  # noqa: E731
    assert spread(loose) > 3 * spread(tight)


def test_router_with_thompson_converges_on_the_faster_head(clock) -> None:  # type: ignore[no-untyped-def]
    router = Router(RouterConfig(policy="thompson"), clock=clock, rng=random.Random(5))
    for name, tps in (("fast", 60.0), ("slow", 40.0)):
        router.upsert_node(NodeRecord(name, "m", 0, 31, 32, f"http://{name}.test", tps))
    picks = []
    for _ in range(300):
        decision = router.choose("m")
        head = decision.route.head.node_id
        picks.append(head)
        clock.advance(5.0)
        router.record(decision, Outcome(300, 300 / (60.0 if head == "fast" else 40.0)))
    assert picks[-100:].count("fast") >= 97


def test_inlined_fast_path_matches_the_general_draw() -> None:
    policy = ThompsonPolicy()
    arms = [arm("a"), arm("b"), arm("c")]
    # Close speeds and different sample counts, so reliability means (0.95 + counts) and
    # spreads both decide the draws.
    for a, tps, n in zip(arms, (50.0, 49.5, 49.0), (2, 5, 12), strict=True):
        teach(policy, a, tps, n, now=100.0)
    fast, general = random.Random(5), random.Random(5)
    for _ in range(300):
        scores = [ThompsonPolicy._belief_score(policy.belief(a.signature), a, 100.0,  # type: ignore[arg-type]
                                               policy.half_life_s, general.gauss) for a in arms]
        assert policy.choose(arms, 100.0, fast)[0] == scores.index(max(scores))


def test_what_peers_measured_leads_once_it_outweighs_our_own_samples() -> None:
    """Gossip: our 3 samples said route a is fast; peers' 100 fresh ones say it slowed to
    5 tok/s. The merged view outweighs our own belief, so traffic follows the peers."""
    policy = ThompsonPolicy()
    a, b = arm("a"), arm("b")
    teach(policy, a, tps=50.0, n=3)
    teach(policy, b, tps=30.0, n=3)
    own_a = RouteView(50.0, 3.0, 0.1, 3.0, 0.0, 3, "proven", 1)
    own_b = RouteView(30.0, 3.0, 0.1, 3.0, 0.0, 3, "proven", 1)
    alone = shares(policy, [arm("a", view=own_a), arm("b", view=own_b)])
    assert alone[0] > 0.9  # on our own samples a is the clear winner
    merged_a = RouteView(5.6, 103.0, 0.1, 103.0, 0.0, 103, "proven", 2)  # peers: a is slow
    merged = shares(policy, [arm("a", view=merged_a), arm("b", view=own_b)])
    assert merged[1] > 0.9  # tolerance: the posterior at mass 103 leaves a < 10 % of draws


def test_a_wall_clock_stepping_back_changes_nothing() -> None:
    """time.time() can step back (NTP): beliefs dated after `now` are taken as of now, not
    drawn with a negative spread (which raised a math domain error)."""
    fast, slow, failing = arm("fast"), arm("slow"), arm("failing")
    policy = ThompsonPolicy()
    teach(policy, fast, 50.0, 30, now=1_000.0)
    teach(policy, slow, 10.0, 30, now=1_000.0)
    teach(policy, failing, 40.0, 30, now=1_000.0, fail_every=3)
    assert shares(policy, [fast, slow, failing], now=400.0) == shares(
        policy, [fast, slow, failing], now=1_000.0)
