"""What thompson believes of one route: its saturation curve (`saturation.CurveBelief`), its
decayed successes and failures with their change detectors (`detectors.py`), and the draw
of its reliability; and when a peer's curve summary needs no refit."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from ..saturation import REFIT_SHARE, CurveBelief
from ..stats import Curve, decay_factor
from .detectors import FAIL_RESET, failure_cusums

# Beta prior on reliability: mean 0.95 with the weight of two requests (routes mostly work).
PRIOR_OK, PRIOR_FAIL = 1.9, 0.1
MAX_RESULTS = 200.0  # cap on the decayed success + failure weight
MIN_RELIABILITY = 0.01
NO_FAILURES = 0.01  # decayed failures below this: reliability is its mean, no draw
# A peer's curve (gossip) is refitted when a bin's mean log tps moves by more than this (2 %):
# at the mass cap its mass no longer moves, so a drifting route would otherwise keep its prior.
PRIOR_REFIT_LOG = 0.02


@dataclass(slots=True)
class ArmBelief:
    """Decayed posterior statistics of one route, written only by `observe`."""

    curve: CurveBelief = field(default_factory=CurveBelief)
    ok: float = 0.0  # decayed successes
    fail: float = 0.0  # decayed failures
    t: float = 0.0  # time of the last update
    fail_up: float = 0.0  # change-detector statistics of the failures
    fail_down: float = 0.0
    result_decision: int = 0  # the model's outcome count at the last result
    decision: int = 0  # the model's outcome count at the last tps sample
    model: str = ""
    shared: tuple[int, int, Curve] | None = None  # (changes, samples, curve.summary()) then

    @property
    def mass(self) -> float:
        """Decayed weight of the tps samples (as of the last update)."""
        return self.curve.mass

    def decay(self, now: float, half_life_s: float) -> None:
        """Decay every weight to `now`."""
        d = decay_factor(now - self.t, half_life_s)
        self.curve.decay(d)
        self.ok *= d
        self.fail *= d
        self.t = max(self.t, now)

    def add_result(self, ok: bool) -> None:
        """Count a success or a failure; a run of failures on a reliable route is a change."""
        q0 = min(max((PRIOR_FAIL + self.fail) / (PRIOR_OK + PRIOR_FAIL + self.ok + self.fail),
                     0.01), 0.99)
        self.fail_up, self.fail_down, change = failure_cusums(self.fail_up, self.fail_down,
                                                               ok, q0)
        if change == "failing":  # forget the old successes
            self.ok = min(self.ok, FAIL_RESET)
        elif change == "recovered":  # forget the old failures
            self.fail = min(self.fail, FAIL_RESET)
        if ok:
            self.ok += 1.0
        else:
            self.fail += 1.0
        total = self.ok + self.fail
        if total > MAX_RESULTS:
            self.ok *= MAX_RESULTS / total
            self.fail *= MAX_RESULTS / total


def reliability(ok: float, fail: float, rng: random.Random) -> float:
    """A Beta(PRIOR_OK + ok, PRIOR_FAIL + fail) draw; the mean when nothing failed."""
    a, b = PRIOR_OK + ok, PRIOR_FAIL + fail
    n = a + b
    p: float = a / n
    if fail > NO_FAILURES:
        # Normal approximation of the Beta draw: ~10x cheaper than betavariate.
        p += math.sqrt(a * b / (n * n * (n + 1.0))) * rng.gauss(0.0, 1.0)
        p = min(max(p, MIN_RELIABILITY), 1.0)
    return p


def alike(a: Curve, b: Curve) -> bool:
    """Same bins, total mass within REFIT_SHARE, every bin's speed within PRIOR_REFIT_LOG:
    a prior fitted to `a` need not be redone for `b`."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x[0] != y[0] or abs(x[2] - y[2]) > PRIOR_REFIT_LOG:
            return False
    ma, mb = sum(x[1] for x in a), sum(x[1] for x in b)
    return abs(ma - mb) <= REFIT_SHARE * max(ma, mb)
