"""What every policy shares: the one tokens/s rule of an outcome."""

from __future__ import annotations

import math

import pytest

from meshroute_middleware.core import Outcome
from meshroute_middleware.core.contracts.limits import MAX_TPS


@pytest.mark.parametrize(("outcome", "tps"), [
    (Outcome(100, 2.0), 50.0),
    (Outcome(0, 2.0), 0.0),
    (Outcome(100, 0.0), None),
    (Outcome(100, -1.0), None),
    (Outcome(100, math.inf), None),
    (Outcome(100, math.nan), None),
    (Outcome(100, 2.0, error="timeout"), None),
    (Outcome(10**12, 1.0), MAX_TPS),
])
def test_tokens_per_second_is_one_rule(outcome: Outcome, tps: float | None) -> None:
    assert outcome.tps == tps
