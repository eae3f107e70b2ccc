"""The adr0021 policy: greedy cold start, scout rate, exploit split ∝ tps^alpha."""

from __future__ import annotations

import random

import pytest

from meshroute_middleware.core import Adr0021Policy, Arm, NodeRecord, RouteView
from meshroute_middleware.core.kinds import Status
from meshroute_middleware.core.routes import Hop, make_route

DRAWS = 4000  # ADR-0021's verification: 4,000 seeded draws
TOLERANCE = 0.03  # ±0.03 on a share; the binomial sd at 4,000 draws is ≤ 0.008, so ~4 sd


def arm(name: str, prior: float, tps: float | None = None, status: Status = "unsampled",
        mass: float = 0.0) -> Arm:
    node = NodeRecord(name, "m", 0, 39, 40, f"http://{name}.test", prior)
    view = RouteView(tps, mass, None, 0.0, 0.0, 1 if tps else 0, status, 1 if tps else 0)
    return Arm(make_route("m", [Hop(node, 0, 39)]), view)


def proven(name: str, tps: float, prior: float = 10.0) -> Arm:
    return arm(name, prior, tps, "proven", 3.0)


def draw_shares(policy: Adr0021Policy, arms: list[Arm], seed: int = 7) -> tuple[list[float],
                                                                                 dict[str, int]]:
    rng, counts, modes = random.Random(seed), [0] * len(arms), dict[str, int]()
    for _ in range(DRAWS):
        i, mode = policy.choose(arms, 0.0, rng)
        counts[i] += 1
        modes[mode] = modes.get(mode, 0) + 1
    return [c / DRAWS for c in counts], modes


def test_traffic_split_follows_tps_ratio_at_alpha_1() -> None:
    shares, modes = draw_shares(Adr0021Policy(0.3, 1.0), [proven("a", 60.0), proven("b", 40.0)])
    assert shares[0] == pytest.approx(0.6, abs=TOLERANCE)
    assert shares[1] == pytest.approx(0.4, abs=TOLERANCE)
    assert modes == {"exploit": DRAWS}  # nothing to scout: every arm is proven


def test_scout_rate_is_the_explore_share() -> None:
    arms = [proven("a", 60.0), proven("b", 40.0), arm("new", 5.0)]
    shares, modes = draw_shares(Adr0021Policy(0.3, 1.0), arms)
    assert modes["scout"] / DRAWS == pytest.approx(0.3, abs=TOLERANCE)
    assert shares[2] == modes["scout"] / DRAWS  # every scout went to the unproven arm
    assert shares[0] / (shares[0] + shares[1]) == pytest.approx(0.6, abs=TOLERANCE)


@pytest.mark.parametrize(("alpha", "expected"), [(0.0, 0.5), (2.0, 0.36 / 0.52)])
def test_alpha_shapes_the_split(alpha: float, expected: float) -> None:
    shares, _ = draw_shares(Adr0021Policy(0.3, alpha), [proven("a", 60.0), proven("b", 40.0)])
    assert shares[0] == pytest.approx(expected, abs=TOLERANCE)
    exact = Adr0021Policy(0.3, alpha).shares([proven("a", 60.0), proven("b", 40.0)])
    assert exact[0] == pytest.approx(expected, rel=1e-12)


SCOUT_TARGET = [  # (unproven arms, index expected): least measured first, tie on prior
    ([arm("u", 5.0), arm("v", 9.0)], 1),
    ([arm("d", 50.0, 30.0, "decayed", 0.3), arm("u", 5.0)], 1),
    ([arm("d1", 5.0, 30.0, "decayed", 0.4), arm("d2", 5.0, 30.0, "decayed", 0.2)], 1),
    ([arm("s", 7.0, 80.0, "stale"), arm("u", 6.0)], 0),
]


@pytest.mark.parametrize(("unproven", "expected"), SCOUT_TARGET)
def test_scout_goes_to_the_least_measured(unproven: list[Arm], expected: int) -> None:
    policy = Adr0021Policy(explore_share=1.0)
    i, mode = policy.choose([proven("p", 10.0), *unproven], 0.0, random.Random(1))
    assert (i, mode) == (expected + 1, "scout")


def test_greedy_fallback_is_deterministic_best_prior_without_randomness() -> None:
    arms = [arm("a", 5.0), arm("b", 9.0, 20.0, "stale"), arm("c", 9.0), arm("d", 1.0)]
    rng = random.Random(3)
    state = rng.getstate()
    assert Adr0021Policy().choose(arms, 0.0, rng) == (1, "greedy-fallback")
    assert rng.getstate() == state  # cold start is deterministic: no draw consumed
    assert Adr0021Policy().shares(arms) == [0.0, 1.0, 0.0, 0.0]


def test_shares_sum_to_one_and_include_the_scout() -> None:
    shares = Adr0021Policy(0.3, 1.0).shares([proven("a", 60.0), proven("b", 40.0), arm("u", 1.0)])
    assert shares == pytest.approx([0.7 * 0.6, 0.7 * 0.4, 0.3])
    assert sum(shares) == pytest.approx(1.0)
