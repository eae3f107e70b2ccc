"""Change detection on a route's results: Bernoulli CUSUMs (Page 1954) that tell when a
route that worked starts failing, or a failing one recovers, so that the old results stop
counting (thompson's reliability belief, `beliefs.ArmBelief.add_result`)."""

from __future__ import annotations

import math
from typing import Literal

# Failure change detection: Bernoulli CUSUMs (Page 1954) of "failing at about half" against
# a reliable route's learnt rate, and of "failing at a quarter of the learnt rate" on a
# failing one: 3 failures in a row on a reliable route, or 3-4 successes in a row on a
# failing one, cross FAIL_H and cut the old successes (or failures) to FAIL_RESET.
FAIL_H, FAIL_RESET = 4.5, 1.0

Change = Literal["", "failing", "recovered"]


def llr(ok: bool, q0: float, q1: float) -> float:
    """Log-likelihood ratio of one result: failure rate q1 against q0."""
    return math.log((1 - q1) / (1 - q0)) if ok else math.log(q1 / q0)


def failure_cusums(up: float, down: float, ok: bool, q0: float) -> tuple[float, float, Change]:
    """The two CUSUMs after one result on a route whose learnt failure rate is `q0`: of
    "failing at about half" (`up`) and of "failing at a quarter of q0" (`down`, only on a
    route failing more than 10 %). Crossing FAIL_H resets both and names the change."""
    up = max(0.0, up + llr(ok, q0, min(0.5 + q0 / 2, 0.995)))
    down = max(0.0, down + llr(ok, q0, q0 / 4)) if q0 > 0.1 else 0.0
    if up > FAIL_H:
        return 0.0, 0.0, "failing"
    if down > FAIL_H:
        return 0.0, 0.0, "recovered"
    return up, down, ""
