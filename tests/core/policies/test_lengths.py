"""What a re-try costs: expected answer lengths per class of max_tokens, and the weights."""

from __future__ import annotations

import random

import pytest

from meshroute_middleware.core.policies import lengths
from meshroute_middleware.core.policies.lengths import AnswerLengths, bound_class


def fill(known: AnswerLengths, traffic: list[tuple[int | None, int]], n: int,
         seed: int = 1) -> None:
    rng = random.Random(seed)
    for _ in range(n):
        bound, tokens = traffic[rng.randrange(len(traffic))]
        known.add(bound, tokens)


def test_bound_classes_are_powers_of_two() -> None:
    assert bound_class(None) == 0
    assert bound_class(0) == 0
    assert bound_class(100) == bound_class(127) == 7
    assert bound_class(128) == 8


def test_nothing_known_weighs_one() -> None:
    known = AnswerLengths()
    assert known.weight(64) == 1.0
    assert known.weight(None) == 1.0
    assert known.expected(64) is None


@pytest.mark.parametrize("bound", [None, 4096])
def test_one_bound_for_all_traffic_weighs_one(bound: int | None) -> None:
    # No max_tokens anywhere, or the same generous cap everywhere: it says nothing about
    # the answers, so the policy behaves exactly as without it.
    known = AnswerLengths()
    fill(known, [(bound, 64), (bound, 500), (bound, 300)], 400)
    assert known.weight(bound) == 1.0


def test_short_bounds_weigh_more_and_the_traffic_averages_one() -> None:
    known = AnswerLengths()
    traffic: list[tuple[int | None, int]] = [(128, 90), (None, 300), (None, 280),
                                             (1024, 290), (512, 400)]
    fill(known, traffic, 2000)
    assert known.expected(128) == pytest.approx(90.0)
    assert known.expected(None) == pytest.approx(290.0, rel=0.03)
    assert known.expected(1024) == pytest.approx(290.0, rel=0.03)  # above every answer
    w_short, w_none, w_long = known.weight(128), known.weight(None), known.weight(512)
    assert w_short > 4.0 * w_none > 4.0 * w_long
    assert w_short <= lengths.W_MAX
    # weighted by how often each comes, the weights average one (the clamp can only
    # lower the short class's)
    mean = sum(known.weight(b) for b, _ in traffic) / len(traffic)
    assert 0.8 < mean < 1.05


def test_a_bound_not_yet_seen_is_read_as_the_typical_length_capped_at_the_bound() -> None:
    known = AnswerLengths()
    fill(known, [(None, 300), (256, 200)], 200)
    assert known.expected(64) == 64.0  # no answer of that class yet: at most the bound
    assert known.expected(8192) == pytest.approx(known.expected(None) or 0.0, rel=0.2)
    assert known.weight(64) > known.weight(256) > known.weight(None)


def test_failures_count_toward_how_often_a_class_comes_not_its_length() -> None:
    known = AnswerLengths()
    fill(known, [(128, 100), (128, 0), (None, 300)], 600)
    assert known.expected(128) == pytest.approx(100.0)


def test_a_huge_bound_from_a_library_caller_is_its_largest_class() -> None:
    """Router.choose is a library API too: a bound past any float is read as 2**20."""
    known = AnswerLengths()
    for _ in range(40):
        known.add(None, 300)
        known.add(64, 50)
    huge = int("9" * 4000)
    assert bound_class(huge) == bound_class(1 << 20) == 21
    assert 0.0 < known.weight(huge) <= lengths.W_MAX  # no OverflowError
    known.add(huge, 300)
    for _ in range(40):
        known.add(huge, 300)
    assert known.weight(huge) == known.weight(1 << 20)
