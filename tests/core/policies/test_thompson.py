"""The thompson policy: scouting, goodput draws, reliability, saturation curves, change."""

from __future__ import annotations

import math
import random

import pytest

from meshroute_middleware.core import Arm, NodeRecord, Outcome, Router, RouterConfig, RouteView
from meshroute_middleware.core.policies.beliefs import ArmBelief
from meshroute_middleware.core.policies.marginal import (
    NEIGHBOUR_WEIGHT,
    QUEUE_TIE,
    gain,
    neighbours_loss,
)
from meshroute_middleware.core.policies.thompson import (
    CONVERSATION_NEIGHBOUR_WEIGHT,
    ThompsonPolicy,
)
from meshroute_middleware.core.prefix import chain
from meshroute_middleware.core.routes import Hop, make_route
from meshroute_middleware.core.saturation import CURVES, MAX_TABULATED, log_g
from meshroute_middleware.core.stats import Curve, MergedRoute, StatEntry

DRAWS = 2000
UNSAMPLED = RouteView(None, 0.0, None, 0.0, 0.0, 0, "unsampled", 0)


def arm(name: str, prior: float = 10.0, in_flight: int = 0,
        view: RouteView = UNSAMPLED) -> Arm:
    node = NodeRecord(name, "m", 0, 31, 32, f"http://{name}.test", prior)
    return Arm(make_route("m", [Hop(node, 0, 31)]), view, in_flight)


def teach(policy: ThompsonPolicy, a: Arm, tps: float, n: int, now: float = 0.0,
          fail_every: int = 0, concurrency: float = 1.0) -> None:
    """Feed n outcomes of 300 tokens at `tps` (every `fail_every`-th one a failure)."""
    for k in range(n):
        if fail_every and k % fail_every == 0:
            policy.observe(a.signature, Outcome(error="stream"), now)
        else:
            policy.observe(a.signature, Outcome(300, 300 / tps, concurrency=concurrency), now)


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
    for _ in range(8):  # interleaved, so that neither arm's results are older
        teach(policy, arms[0], 60.0, 5, fail_every=5)  # 20 % failures: goodput ~48 tok/s
        teach(policy, arms[1], 56.0, 5)
    # Goodput 48 against 56 (log gap 0.15) with reliability sd ~0.06 on the flaky arm: it
    # wins ~2 % of these seeded draws; 0.95 leaves room for twice that and more.
    assert shares(policy, arms)[1] >= 0.95


def test_a_serial_route_under_load_sends_the_next_request_elsewhere() -> None:
    policy = ThompsonPolicy()
    a, b = arm("a"), arm("b")
    # a is serial: alone 50 tok/s, with 2 and 4 in flight a request gets 25 and 12.5.
    for c in (1.0, 2.0, 4.0):
        teach(policy, a, 50.0 / c, 30, concurrency=c)
    teach(policy, b, 40.0, 30)
    # With 3 in flight on a, a 4th gets ~12.5 tok/s there against 40 on idle b.
    assert shares(policy, [arm("a", in_flight=3), arm("b")])[1] >= 0.99


def test_a_batching_route_keeps_its_traffic_while_its_batch_has_room() -> None:
    policy = ThompsonPolicy()
    a, b = arm("a"), arm("b")
    # a batches: 60 tok/s alone, ~57 with 4 in flight; b is slower even when idle.
    for c in (1.0, 2.0, 4.0):
        teach(policy, a, 60.0 / (1 + 0.02 * (c - 1)), 30, concurrency=c)
    teach(policy, b, 40.0, 30)
    # The serial rule of the old policy, (in_flight + 1) / tps, sent this request to b; the
    # learnt curve says a 4th request on a still runs ~57 tok/s and costs the others ~3.
    assert shares(policy, [arm("a", in_flight=3), arm("b")])[0] >= 0.99


def test_gain_reads_the_g_table_and_computes_past_it_alike() -> None:
    """gain() reads both g values from one row of the table while n + 1 is tabulated and
    computes them beyond: the same formula either way (own speed minus half the neighbours'
    loss; with every announced slot taken all they lose plus QUEUE_TIE of its own), checked
    against log_g at the table's edge."""
    for j in (0, 13, 40, len(CURVES) - 1):
        knee, slowdown = CURVES[j]
        for n in (0, 1, 3, MAX_TABULATED - 1, MAX_TABULATED, MAX_TABULATED + 1):
            own = 50.0 * math.exp(log_g(n + 1, knee, slowdown))
            lost = n * (50.0 * math.exp(log_g(n, knee, slowdown)) - own) if n else 0.0
            assert gain(50.0, j, n) == pytest.approx(own - NEIGHBOUR_WEIGHT * lost, rel=1e-12)
            full = own - lost + QUEUE_TIE * own if n else own
            assert gain(50.0, j, n, True) == pytest.approx(full, rel=1e-12)


def curve_index(knee: float, slowdown: float) -> int:
    return CURVES.index((knee, slowdown))


@pytest.mark.parametrize(("s1", "knee", "slowdown", "in_flight", "want"), [
    # A free slot: its own speed less half what a slowing batch costs its neighbours.
    (2000.0, 2.0, 0.0, 0, 2000.0),
    (2000.0, 2.0, 0.0, 1, 2000.0),
    (100.0, 4.0, 0.1, 1, 100 / 1.1 - NEIGHBOUR_WEIGHT * (100 - 100 / 1.1)),
    # Every slot taken (issue 31, scenario 20): it waits and delays all behind it; the mesh
    # gains nothing (T(n+1) - T(n) = 0), only the tie-break of its own expected speed.
    (2000.0, 2.0, 0.0, 2, QUEUE_TIE * 2000 * 2 / 3),
    (2000.0, 2.0, 0.0, 3, QUEUE_TIE * 2000 * 2 / 4),
    (90.0, 1.0, 0.0, 1, QUEUE_TIE * 45.0),
])
def test_the_marginal_cost_of_a_request(s1: float, knee: float, slowdown: float,
                                        in_flight: int, want: float) -> None:
    full = in_flight >= knee  # the server announced `knee` slots
    got = gain(s1, curve_index(knee, slowdown), in_flight, full)
    assert got == pytest.approx(want, rel=1e-9)


@pytest.mark.parametrize(("fast_in_flight", "slow_in_flight", "want"), [
    (0, 0, "fast"), (1, 0, "fast"), (1, 7, "fast"),  # a free fast slot wins
    (2, 0, "slow"), (2, 7, "slow"),  # the fast slots full: the slow node adds 500 tok/s
    (2, 8, "fast"),  # both full: the shorter expected delay
])
def test_a_full_fast_node_is_not_queued_on_while_a_slower_one_has_room(
        fast_in_flight: int, slow_in_flight: int, want: str) -> None:
    # Scenario 20's mesh: 2 slots at 2,000 tok/s beside 8 at 500. Counting half the loss
    # (before issue 31) scored the third request on the fast node 667 against 500.
    fast = curve_index(2.0, 0.0)
    slow = curve_index(8.0, 0.0)
    scores = {"fast": gain(2000.0, fast, fast_in_flight, fast_in_flight >= 2),
              "slow": gain(500.0, slow, slow_in_flight, slow_in_flight >= 8)}
    assert max(scores, key=lambda k: scores[k]) == want


def test_a_saturating_route_shares_its_load_past_the_knee() -> None:
    policy = ThompsonPolicy()
    a, b = arm("a"), arm("b")
    # a runs 2 at once at full speed, more queue: per request 60, 60, 40, 30 at 1-4.
    for c in (1.0, 2.0, 3.0, 4.0):
        teach(policy, a, 60.0 * min(1.0, 2.0 / c), 30, concurrency=c)
    teach(policy, b, 40.0, 30)
    assert shares(policy, [arm("a", in_flight=1), arm("b")])[0] >= 0.99  # room: a
    assert shares(policy, [arm("a", in_flight=3), arm("b")])[1] >= 0.99  # past the knee: b


def test_change_detector_relearns_a_route_that_halves_its_speed() -> None:
    policy = ThompsonPolicy()
    a = arm("a")
    teach(policy, a, 60.0, 150)
    assert policy.estimate(a.signature) == pytest.approx(60.0, rel=0.1)
    teach(policy, a, 30.0, 4)
    # Without the detector the capped EWMA (mass 150) would still read ~59 tok/s after four
    # samples at 30; the residual is 0.69 / sigma(~0.2) per sample, so the CUSUM crosses
    # within a few samples, the old mass is cut to 1 and the estimate is below 40 ...
    estimate = policy.estimate(a.signature)
    assert estimate is not None and estimate < 40.0
    teach(policy, a, 30.0, 6)
    # ... and within 10 % of the new speed after ten.
    assert policy.estimate(a.signature) == pytest.approx(30.0, rel=0.1)


def test_a_route_that_starts_failing_loses_its_traffic_within_a_few_failures() -> None:
    policy = ThompsonPolicy()
    a, b = arm("a"), arm("b")
    teach(policy, a, 60.0, 200)
    teach(policy, b, 50.0, 200)
    for _ in range(5):
        policy.observe(a.signature, Outcome(error="http_5xx"), 0.0)
    # Five failures after 200 successes: without the failure detector reliability would be
    # ~0.97 and a would keep ~all traffic; with it the old successes are cut to 2.
    assert shares(policy, [a, b])[1] >= 0.9


def test_a_failed_route_that_recovers_is_found_again() -> None:
    policy = ThompsonPolicy()
    a, b = arm("a"), arm("b")
    teach(policy, b, 60.0, 100)
    teach(policy, a, 90.0, 100)
    teach(policy, a, 90.0, 6, fail_every=1)  # an outage (traffic leaves after a few)
    assert shares(policy, [a, b])[0] <= 0.05
    rng, picks = random.Random(4), []
    for _ in range(300):  # a recovered; we only learn it by trying it
        i = policy.choose([a, b], 0.0, rng)[0]
        picks.append(i)
        teach(policy, [a, b][i], (90.0, 60.0)[i], 1)
    # The results of an unused route count for less as outcomes go by, so a is re-tried;
    # its successes then trip the detector and it wins back the traffic.
    assert picks[-100:].count(0) >= 95


def test_an_unused_route_is_retried_as_decisions_go_by() -> None:
    policy = ThompsonPolicy()
    fast, slow = arm("fast"), arm("slow")
    teach(policy, fast, 60.0, 200)
    teach(policy, slow, 40.0, 200)
    rng, picks = random.Random(8), []
    for _ in range(2000):
        i = policy.choose([fast, slow], 0.0, rng)[0]
        picks.append(i)
        teach(policy, [fast, slow][i], (60.0, 40.0)[i], 1)
    # Exploration by drift, not by a fixed tax: the slow route is re-tried now and then
    # (log gap 0.41: every few hundred decisions) and never takes more than 2 %.
    assert 2 <= picks.count(1) <= 40


def test_the_router_records_the_concurrency_a_request_ran_at(clock) -> None:  # type: ignore[no-untyped-def]
    router = Router(RouterConfig(policy="thompson"), clock=clock, rng=random.Random(5))
    router.upsert_node(NodeRecord("a", "m", 0, 31, 32, "http://a.test", 50.0))
    first = router.choose("m", pin=["a"])
    clock.advance(1.0)
    second = router.choose("m", pin=["a"])
    clock.advance(1.0)
    # first ran 1 s alone and 1 s beside second: mean concurrency 1.5
    assert router.concurrency(first, clock()) == pytest.approx(1.5)
    router.record(first, Outcome(100, 2.0))
    clock.advance(2.0)
    assert router.concurrency(second, clock()) == pytest.approx(4.0 / 3.0)  # 2, then 1, 1


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
    belief = ArmBelief()  # what 100 answers at 50 tok/s teach a policy about a route
    for _ in range(100):
        belief.curve.add(50.0, 1.0)
        belief.add_result(True)
    stale = RouteView(50.0, 0.0, None, 0.0, 0.0, 0, "stale", 1)
    tight = [policy.score(a, belief, 0.0, random.Random(k)) for k in range(300)]
    loose = [policy.score(arm("a", view=stale), belief, 0.0, random.Random(k))
             for k in range(300)]
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


def peer_arm(name: str, tps: float, mass: float, curve: Curve | None,
             in_flight: int = 0, own: StatEntry | None = None) -> Arm:
    """An arm known through a peer's entry (gossip), with that peer's curve summary, and
    `own` entry if we measured it too."""
    node = NodeRecord(name, "m", 0, 31, 32, f"http://{name}.test", 10.0)
    entry = StatEntry(tps, mass, 0.0, 0.1, mass, 0.0, int(mass), "", curve)
    entries = (entry,) if own is None else (entry, own)
    merged = MergedRoute(entries, float("-inf"), 600.0)
    return Arm(make_route("m", [Hop(node, 0, 31)]), None, in_flight, merged, 0.0)


# A peer's curves: a serial (100 tok/s alone, measured at 1-3 in flight, mean 81) and b
# batching freely at 60.
SERIAL = ((0, 20.0, math.log(100.0)), (4, 6.0, math.log(50.0)), (6, 4.0, math.log(100 / 3)))
ROOMY = ((0, 10.0, math.log(60.0)), (4, 5.0, math.log(60.0)), (6, 5.0, math.log(60.0)))


def test_a_peers_curve_is_the_prior_of_a_route_not_measured_here() -> None:
    policy = ThompsonPolicy()
    with_curves = [peer_arm("a", 81.0, 30.0, SERIAL, in_flight=1),
                   peer_arm("b", 60.0, 20.0, ROOMY)]
    # the peer's curve: a's speed alone is 100, and a second request there gets 50 and
    # halves the first one's: b's 60 is the better place
    assert shares(policy, with_curves)[1] >= 0.99
    assert shares(policy, [peer_arm("a", 81.0, 30.0, SERIAL), with_curves[1]])[0] >= 0.99
    # without curves the knee is a guess: a keeps a large share (the control; ~45 %)
    without = [peer_arm("a", 81.0, 30.0, None, in_flight=1), peer_arm("b", 60.0, 20.0, None)]
    assert shares(policy, without)[0] >= 0.3


def test_a_peers_curve_leads_once_it_outweighs_our_own_samples() -> None:
    policy = ThompsonPolicy()
    a = arm("a")
    teach(policy, a, 100.0, 2)  # two samples alone: nothing known of a's knee
    assert policy.curve_summary(a.signature) == ((0, 2.0, pytest.approx(math.log(100.0))),)
    assert policy.curve_summary("m|never") is None
    own = StatEntry(100.0, 2.0, 0.0, 0.1, 2.0, 0.0, 2, "", policy.curve_summary(a.signature))
    arms = [peer_arm("a", 81.0, 30.0, SERIAL, in_flight=1, own=own),
            peer_arm("b", 60.0, 20.0, ROOMY)]
    assert shares(policy, arms)[1] >= 0.99  # the peer's 30 samples lead: a is serial


def test_a_peers_curve_is_refitted_when_its_speed_moves_at_the_mass_cap() -> None:
    policy = ThompsonPolicy()
    roomy = [peer_arm("a", 81.0, 30.0, SERIAL, in_flight=1), peer_arm("b", 60.0, 20.0, ROOMY)]
    assert shares(policy, roomy)[1] >= 0.99
    # the same bins and masses, b now 1 tok/s at every concurrency: queueing behind a's one
    # slot adds nothing to the mesh, but its tie-break (QUEUE_TIE x ~50 tok/s: shortest
    # expected delay) is worth more than b's 1
    slow = tuple((k, m, math.log(1.0)) for k, m, _ in ROOMY)
    assert shares(policy, [roomy[0], peer_arm("b", 1.0, 20.0, slow)])[0] >= 0.9


def test_the_routing_table_shows_the_policys_estimate_which_follows_a_slowdown(clock) -> None:  # type: ignore[no-untyped-def]
    """`estimate_tps` is thompson's own s1: after a 3x slowdown it reads the new speed within
    ten samples, while the shared decayed mean (`tps`, ADR-0021) still reads far above it."""
    router = Router(RouterConfig(policy="thompson"), clock=clock, rng=random.Random(5))
    router.upsert_node(NodeRecord("gpu", "m", 0, 31, 32, "http://gpu.test", 60.0))

    def run(tps: float, n: int) -> dict[str, float]:
        for _ in range(n):
            decision = router.choose("m")
            clock.advance(1.0)
            router.record(decision, Outcome(300, 300 / tps))
        (row,) = router.routing_table("m")["models"]["m"]["candidates"]
        return row  # type: ignore[no-any-return]

    assert router.routing_table("m")["models"]["m"]["candidates"][0]["estimate_tps"] is None
    before = run(60.0, 100)
    assert before["estimate_tps"] == pytest.approx(60.0, rel=0.02)
    after = run(20.0, 10)
    assert after["estimate_tps"] == pytest.approx(20.0, rel=0.1)
    assert after["tps"] > 30.0  # the shared mean lags: what the demo showed before


def test_the_estimate_is_the_posterior_mean_while_the_curves_cannot_be_told_apart(clock) -> None:  # type: ignore[no-untyped-def]
    """Four always in flight at 60 tok/s each: s1 could be anything from 60 (no slowdown)
    to 240 (one shared pipe). The display reads the posterior's geometric mean, strictly
    inside, not the best fit, which with every curve fitting alike is the grid's first one
    (knee 1: 240 tok/s; what the dashboard showed as a spike)."""
    router = Router(RouterConfig(policy="thompson"), clock=clock, rng=random.Random(5))
    router.upsert_node(NodeRecord("gpu", "m", 0, 31, 32, "http://gpu.test", 60.0))
    flying = [router.choose("m") for _ in range(4)]
    for _ in range(40):
        clock.advance(1.0)
        router.record(flying.pop(0), Outcome(300, 300 / 60.0))
        flying.append(router.choose("m"))
    (row,) = router.routing_table("m")["models"]["m"]["candidates"]
    assert 80.0 < row["estimate_tps"] < 180.0
    assert row["tps"] == pytest.approx(60.0)


def test_policies_without_an_estimate_show_none(clock) -> None:  # type: ignore[no-untyped-def]
    router = Router(RouterConfig(policy="adr0021"), clock=clock, rng=random.Random(5))
    router.upsert_node(NodeRecord("gpu", "m", 0, 31, 32, "http://gpu.test", 60.0))
    decision = router.choose("m")
    router.record(decision, Outcome(300, 5.0))
    (row,) = router.routing_table("m")["models"]["m"]["candidates"]
    assert row["estimate_tps"] is None and row["tps"] == pytest.approx(60.0)


def test_retries_go_to_requests_whose_max_tokens_says_the_answer_is_short() -> None:
    # A re-try of the slower route is worth the same on any request and costs in proportion
    # to the answer: with a quarter of the requests bounded at 128 tokens (answers of 100)
    # and the rest unbounded (answers of 300), the re-tries land on the short ones.
    policy = ThompsonPolicy()
    fast, slow = arm("fast"), arm("slow")
    routes = {True: [Arm(a.route, a.view, 0, None, 0.0, 128) for a in (fast, slow)],
              False: [fast, slow]}
    for i, a in enumerate((fast, slow)):
        for _ in range(200):
            policy.observe(a.signature, Outcome(300, 300 / (60.0, 50.0)[i]), 0.0)
    rng, retries, short_requests = random.Random(4), {True: 0, False: 0}, 0
    for k in range(4000):
        short = k % 4 == 0
        short_requests += short
        i = policy.choose(routes[short], 0.0, rng)[0]
        retries[short] += i
        tokens = 100 if short else 300
        policy.observe(routes[short][i].signature,
                       Outcome(tokens, tokens / (60.0, 50.0)[i],
                               max_tokens=128 if short else None), 0.0)
    assert retries[True] + retries[False] >= 10  # the drift still re-opens the slow route
    # per request, a short one re-tries several times as often as a long one
    assert retries[True] / short_requests > 4 * retries[False] / (4000 - short_requests)


def test_without_max_tokens_the_retries_are_what_they_were() -> None:
    # The weights are all one when no request sets max_tokens: the very same draws.
    picks = []
    for bounded in (False, True):
        policy = ThompsonPolicy()
        fast, slow = arm("fast"), arm("slow")
        teach(policy, fast, 60.0, 200)
        teach(policy, slow, 50.0, 200)
        rng, seq = random.Random(8), []
        for _ in range(1500):
            i = policy.choose([fast, slow], 0.0, rng)[0]
            seq.append(i)
            bound = 4096 if bounded else None  # one bound for all: says nothing either
            policy.observe([fast, slow][i].signature,
                           Outcome(300, 300 / (60.0, 50.0)[i], max_tokens=bound), 0.0)
        picks.append(seq)
    assert picks[0] == picks[1]
    assert 20 < picks[0].count(1) < 580  # both routes in play: reads could have moved picks
    assert 3 <= picks[0].count(1) <= 150


def test_reading_the_estimate_changes_no_decision() -> None:
    """`estimate` is for display: a refit it makes is not kept, so the decisions of a policy
    whose estimate is read after every sample are the very same as one never read."""
    picks = []
    for read in (False, True):
        policy = ThompsonPolicy()
        fast, slow = arm("fast"), arm("slow")
        rng, seq = random.Random(11), []
        for k in range(300):  # two requests at a time: a read between their two ends
            pair = [policy.choose([fast, slow], float(k), rng)[0] for _ in range(2)]
            seq += pair
            for j, i in enumerate(pair):
                tps = (60.0, 58.0)[i] * (1.0 + 0.3 * math.sin(2 * k + j))
                policy.observe([fast, slow][i].signature, Outcome(300, 300 / tps), float(k))
                if read and j == 0:
                    policy.estimate(fast.signature)
                    policy.estimate(slow.signature)
        picks.append(seq)
    assert picks[0] == picks[1]
    assert 20 < picks[0].count(1) < 580  # both routes in play: reads could have moved picks


@pytest.mark.parametrize(("slots", "weight", "counted"), [
    (2, NEIGHBOUR_WEIGHT, 1.0),  # a new prompt on a full route: all its neighbours lose
    (None, NEIGHBOUR_WEIGHT, NEIGHBOUR_WEIGHT),  # slots unsaid: the half weight
    (4, NEIGHBOUR_WEIGHT, NEIGHBOUR_WEIGHT),  # a slot free
    (2, CONVERSATION_NEIGHBOUR_WEIGHT, CONVERSATION_NEIGHBOUR_WEIGHT),  # warm elsewhere
])
def test_a_prompts_score_counts_its_neighbours_by_the_routes_slots(
        slots: int | None, weight: float, counted: float) -> None:
    node = NodeRecord("n", "m", 0, 31, 32, "http://n.test", 100.0, slots=slots)
    a = Arm(make_route("m", [Hop(node, 0, 31)]), UNSAMPLED, 2)
    a.prefix = chain([b"system"], [500])
    j = curve_index(2.0, 0.1) if slots == 2 else curve_index(4.0, 0.1)
    own, lost = neighbours_loss(100.0, j, 2)
    # nothing learned of the prefill or the wait: the score is own less the counted loss
    got = ThompsonPolicy().with_prefill(a, (1.0, 100.0, j), 100.0, weight)
    assert got == pytest.approx(own - counted * lost, rel=1e-9)
