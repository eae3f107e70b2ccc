"""Thompson sampling on expected goodput, load-aware: meshroute's own route policy.

Each route keeps a log-normal posterior on its end-to-end tokens/s and a Beta posterior on its
success rate, learnt from this router's outcomes. Masses decay with time and are capped, a
CUSUM change detector cuts them on a sustained shift, and a route's spread widens with the time
since its last sample: exploration comes from the posterior rather than from a fixed tax, a
drifting route is re-learnt within about ten samples, and a route left alone is re-tried. A
decision draws reliability × tokens/s for every route and takes the smallest expected delay
`(in_flight + 1) / goodput`: plain Thompson sampling when nothing is in flight, load spreading
when queues build. Results and tuning: docs/benchmarks.md, "Learning quality".
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ..kinds import DECAYED, PROVEN, STALE
from ..stats import HALF_LIFE_S, LN2, decay_factor
from .base import EXPLOIT, GREEDY, SCOUT, Arm, Mode, Outcome

if TYPE_CHECKING:
    from ..config import RouterConfig

# Cap on an arm's decayed sample mass: an EWMA with weight >= 1/201 per sample. A route that
# drifts is caught by the change detector below, not by this cap (tuned: bench_learning.py).
MAX_MASS = 200.0
SHARED_DOMINATES = 2.0  # the merged view leads once it holds 2x our own sample mass
# Change detection (Page's CUSUM, 1954) on standardised log-tps residuals; a detected change
# cuts the mass. Reference k = 0.5 sigma as usual; threshold h = 8 sigma rather than the
# textbook 4-5 because sigma is itself estimated and the noise heavy-tailed: at h = 5 false
# alarms cost 0.5 % of throughput in scenario 6-noisy-8 and h = 8 still catches a halving in
# about ten samples at sigma 0.5 (benchmarks/bench_learning.py, scenario 3-drift).
CUSUM_K, CUSUM_H = 0.5, 8.0
CUSUM_MIN_MASS = 4.0
RESET_MASS = 3.0
# Mass given to statistics measured under an older topology (ADR-0021 "stale": a prior only).
STALE_MASS = 2.0
# Log-space spread of an arm known only by its advertised prior: x2 either way at 1 sigma.
PRIOR_SIGMA = 0.7
MAX_SIGMA = PRIOR_SIGMA  # a decayed arm is never less known than a never-seen one
# Posterior spread multiplier: Thompson sampling over-explores in practice and a narrower
# posterior earns more (Chapelle & Li, "An Empirical Evaluation of Thompson Sampling", 2011);
# 0.5 measured best of {0.5, 0.7, 1} in benchmarks/bench_learning.py.
SD_SCALE = 0.5
# Beliefs forget this many times slower than the shared statistics' half-life: time decay only
# re-opens routes not in use; drift of a route in use is caught by the change detector.
BELIEF_HALF_LIFE_FACTOR = 6.0
# A route's log-speed is modelled as a random walk: its variance grows by this much per second
# since the route's last sample (sd ~0.19 after an hour), so a route left alone is re-tried and
# one that got faster is found. 1e-5 measured as the balance between re-trying in stationary
# scenarios (-0.1 to -0.5 % of throughput) and finding a recovered route (8-recovery: +4 %).
DRIFT_VAR_PER_S = 1e-5
# Prior guess of the per-request log-tps noise, worth PRIOR_SIGMA_MASS samples; the sampled
# spread is sigma / sqrt(mass). 0.3 ~ the noise of a quiet LAN mesh (sim scenario defaults).
OBS_SIGMA = 0.3
PRIOR_SIGMA_MASS = 2.0
# Beta prior on reliability: mean 0.95 with the weight of two requests (routes mostly work).
PRIOR_OK, PRIOR_FAIL = 1.9, 0.1
MIN_RELIABILITY = 0.01
NO_FAILURES = 0.01  # decayed failures below this: reliability is its mean, no draw
MAX_TRACKED = 4096  # arms kept before old ones are pruned


@dataclass(slots=True)
class ArmBelief:
    """Decayed posterior statistics of one route, written only by `observe`."""

    mean_log_tps: float = 0.0
    var_log_tps: float = 0.0
    mass: float = 0.0  # decayed, capped weight of the tps samples
    ok: float = 0.0  # decayed successes
    fail: float = 0.0  # decayed failures
    t: float = 0.0  # time of the last update
    sd_unit: float = SD_SCALE * OBS_SIGMA  # SD_SCALE · sigma(), kept current by add_tps
    log_p_ok: float = math.log(PRIOR_OK / (PRIOR_OK + PRIOR_FAIL))  # mean, at last update
    cusum_up: float = 0.0  # change-detector statistics of the log-tps residuals
    cusum_down: float = 0.0

    def decay(self, now: float, half_life_s: float) -> None:
        """Decay every weight to `now`."""
        d = decay_factor(now - self.t, half_life_s)
        self.mass *= d
        self.ok *= d
        self.fail *= d
        self.t = max(self.t, now)

    def sigma(self) -> float:
        """Per-request noise of log tps: the sample spread shrunk toward OBS_SIGMA."""
        m = self.mass
        return math.sqrt((OBS_SIGMA * OBS_SIGMA * PRIOR_SIGMA_MASS + self.var_log_tps * m)
                         / (PRIOR_SIGMA_MASS + m))

    def add_tps(self, tps: float) -> None:
        """Take one tps sample into the capped EWMA of log tps and its variance."""
        x = math.log(tps)
        delta = x - self.mean_log_tps
        if self.mass >= CUSUM_MIN_MASS and self._shifted(delta / self.sigma()):
            self.mass = min(self.mass, RESET_MASS)  # a change: let new samples dominate
        m = min(self.mass, MAX_MASS)
        m1 = m + 1.0
        self.mean_log_tps += delta / m1
        self.var_log_tps = (m * self.var_log_tps + m * delta * delta / m1) / m1
        self.mass = m1
        self.sd_unit = SD_SCALE * self.sigma()

    def _shifted(self, z: float) -> bool:
        """Two-sided CUSUM on standardised residuals (Page 1954): a sustained shift."""
        self.cusum_up = max(0.0, self.cusum_up + z - CUSUM_K)
        self.cusum_down = max(0.0, self.cusum_down - z - CUSUM_K)
        if self.cusum_up > CUSUM_H or self.cusum_down > CUSUM_H:
            self.cusum_up = self.cusum_down = 0.0
            return True
        return False

    def add_result(self, ok: bool) -> None:
        """Count a success or a failure, keeping the total weight under MAX_MASS."""
        if ok:
            self.ok += 1.0
        else:
            self.fail += 1.0
        total = self.ok + self.fail
        if total > MAX_MASS:
            self.ok *= MAX_MASS / total
            self.fail *= MAX_MASS / total
        self.log_p_ok = math.log((PRIOR_OK + self.ok) / (PRIOR_OK + PRIOR_FAIL + self.ok
                                                         + self.fail))


def _log_reliability(ok: float, fail: float, gauss: Callable[[float, float], float]) -> float:
    """Log of a Beta(PRIOR_OK + ok, PRIOR_FAIL + fail) draw; the mean when nothing failed."""
    a, b = PRIOR_OK + ok, PRIOR_FAIL + fail
    n = a + b
    p = a / n
    if fail > NO_FAILURES:
        # Normal approximation of the Beta draw: ~10x cheaper than betavariate.
        p += math.sqrt(a * b / (n * n * (n + 1.0))) * gauss(0.0, 1.0)
        p = min(max(p, MIN_RELIABILITY), 1.0)
    return math.log(p)


class ThompsonPolicy:
    """Thompson sampling on reliability × tokens/s with a shortest-expected-delay choice."""

    name: ClassVar[str] = "thompson"

    def __init__(self, half_life_s: float = HALF_LIFE_S * BELIEF_HALF_LIFE_FACTOR,
                 min_sample_tokens: int = 8) -> None:
        self.half_life_s = half_life_s  # of this policy's own beliefs
        self.min_sample_tokens = min_sample_tokens
        self._beliefs: dict[str, ArmBelief] = {}

    @classmethod
    def from_config(cls, config: RouterConfig) -> ThompsonPolicy:
        """The policy for a router config (beliefs forget slower than the shared stats)."""
        return cls(config.half_life_s * BELIEF_HALF_LIFE_FACTOR, config.min_sample_tokens)

    def belief(self, signature: str) -> ArmBelief | None:
        """The posterior statistics of one route, if it was ever observed."""
        return self._beliefs.get(signature)

    def choose(self, arms: Sequence[Arm], now: float, rng: random.Random) -> tuple[int, Mode]:
        """Try an untried arm first (best prior first; "greedy-fallback" while nothing at all
        is known, as ADR-0021); otherwise sample and take the least expected delay, i.e. the
        largest log(reliability · tps) − log(in_flight + 1)."""
        gauss, beliefs, half_life_s = rng.gauss, self._beliefs, self.half_life_s
        decay_rate = -LN2 / half_life_s
        best, best_score, untried, untried_prior = 0, -math.inf, -1, -1.0
        known = False  # whether any arm was ever measured (else: ADR-0021's cold start)
        for i, arm in enumerate(arms):
            belief = beliefs.get(arm.route.signature)
            if (belief is not None and arm.origins > 1
                    and arm.view.mass > SHARED_DOMINATES * belief.mass + 1.0):
                belief = None  # peers (gossip) measured this route far more than we did
            if belief is None:
                view = arm.view
                if not (arm.in_flight or view.count or view.status == STALE):
                    if arm.prior_tps > untried_prior:
                        untried, untried_prior = i, arm.prior_tps
                    continue
                mu, sd = self._shared_prior(arm)
                score = mu + sd * gauss(0.0, 1.0) + _log_reliability(view.ok, view.fail, gauss)
            elif belief.fail <= NO_FAILURES and belief.mass > 0.0 and not arm.stale:
                # The common case, inlined for speed (_belief_score is the general form):
                # a measured route without failures, its reliability the mean at last update.
                dt = now - belief.t
                if dt < 0.0:  # the wall clock stepped back: no decay, no drift
                    dt = 0.0
                mass = belief.mass * math.exp(decay_rate * dt) if dt > 0.0 else belief.mass
                sd = math.sqrt(belief.sd_unit * belief.sd_unit / mass + DRIFT_VAR_PER_S * dt)
                score = (belief.mean_log_tps + (sd if sd < MAX_SIGMA else MAX_SIGMA)
                         * gauss(0.0, 1.0) + belief.log_p_ok)
            else:
                score = self._belief_score(belief, arm, now, half_life_s, gauss)
            known = True
            if arm.in_flight:
                score -= math.log(arm.in_flight + 1)
            if score > best_score:
                best, best_score = i, score
        if untried >= 0:
            return untried, (SCOUT if known else GREEDY)
        return best, EXPLOIT

    @staticmethod
    def _belief_score(belief: ArmBelief, arm: Arm, now: float, half_life_s: float,
                      gauss: Callable[[float, float], float]) -> float:
        """One posterior draw of log(reliability · tps) from this policy's own belief."""
        dt = max(now - belief.t, 0.0)  # a wall clock that stepped back: no decay, no drift
        d = math.exp(-LN2 * dt / half_life_s) if dt > 0 else 1.0  # decay_factor, inlined
        mass = belief.mass * d
        if arm.view.status == STALE:
            mass = min(mass, STALE_MASS)  # measured under an older topology: a prior only
        if mass > 0.0:
            sd = math.sqrt(belief.sd_unit * belief.sd_unit / mass + DRIFT_VAR_PER_S * dt)
            mu = belief.mean_log_tps + (sd if sd < MAX_SIGMA else MAX_SIGMA) * gauss(0.0, 1.0)
        else:  # failures only so far
            mu0, sd = ThompsonPolicy._shared_prior(arm)
            mu = mu0 + sd * gauss(0.0, 1.0)
        return mu + _log_reliability(belief.ok * d, belief.fail * d, gauss)

    @staticmethod
    def _shared_prior(arm: Arm) -> tuple[float, float]:
        """Log-tps prior from the shared (gossiped) view, else from the advertised prior."""
        view = arm.view
        if view.tps is not None and view.tps > 0:
            fresh = view.status in (PROVEN, DECAYED)  # else stale: an older topology's
            mass = min(max(view.mass, 1.0), MAX_MASS) if fresh else 1.0
            return math.log(view.tps), OBS_SIGMA / math.sqrt(mass)
        return math.log(max(arm.prior_tps, 1e-6)), PRIOR_SIGMA

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """Learn from a finished request: a tps sample, or a success/failure only."""
        belief = self._beliefs.get(signature)
        if belief is None:
            if len(self._beliefs) >= MAX_TRACKED:
                self._prune(now)
            belief = self._beliefs[signature] = ArmBelief(t=now)
        belief.decay(now, self.half_life_s)
        belief.add_result(outcome.ok)
        tps = outcome.tps  # the one tokens/s rule: capped at MAX_TPS, None if unmeasurable
        if outcome.ok and outcome.completion_tokens >= self.min_sample_tokens and tps is not None:
            belief.add_tps(tps)

    def _prune(self, now: float) -> None:
        """Forget the half of the arms updated longest ago."""
        ordered = sorted(self._beliefs, key=lambda s: self._beliefs[s].t)
        for signature in ordered[: len(ordered) // 2]:
            del self._beliefs[signature]
