"""Thompson sampling on each route's saturation curve: meshroute's own route policy.

Per route it learns how a request's speed depends on how many requests the route runs at
once (`saturation.CurveBelief`: a posterior over a knee and a per-neighbour slowdown, fitted
to end-to-end tokens/s samples recorded with the concurrency they ran at), and a Beta posterior
on its success rate. A decision draws one curve and one reliability per route and sends the
request where it adds the most expected delivered tokens/s given what is in flight now: its
own speed minus half of what its batch neighbours lose, or all of it when the route's
announced slots are full (a request that queues adds nothing and delays those behind it:
its marginal cost to the mesh, issue 31). "What is in flight" is this tracker's requests and
the others' its nodes reported (`core/node_load.py`). On a batching server that means "stay
on the fast route while its batch has room"; on a serial one, or a saturated batch, it comes
close to shortest expected delay. Exploration comes from the posterior; a CUSUM on the speed
residuals and one on the failures (`detectors.py`) cut the old mass when a route changes, and
a route's spread widens with the time since its last sample, so a route left alone is
re-tried, mostly on requests whose max_tokens says the answer is short
(`lengths.AnswerLengths`: a re-try costs in proportion to the answer). A request carrying a
prompt is scored with its expected first token (`first_token.py`: the prefill of what a
route does not hold, the wait for a slot). The pieces: `beliefs.py` (what is believed of one
route), `marginal.py` (what a request costs its neighbours), `first_token.py`. Results and
tuning: docs/benchmarks.md, "Learning quality".
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from ..defaults import OBS_SIGMA
from ..kinds import DECAYED, PROVEN, STALE
from ..saturation import REFIT_SHARE, CurveBelief, prior_draw, slots_knee
from ..stats import HALF_LIFE_S, LN2, MIN_SAMPLE_TOKENS, Curve, decay_factor
from .base import EXPLOIT, GREEDY, SCOUT, Arm, DecisionMode, Outcome
from .beliefs import NO_FAILURES, PRIOR_FAIL, PRIOR_OK, ArmBelief, alike, reliability
from .first_token import FirstTokens
from .lengths import AnswerLengths
from .marginal import NEIGHBOUR_WEIGHT, gain

if TYPE_CHECKING:
    from ..config import RouterConfig

SHARED_DOMINATES = 2.0  # the merged view leads once it holds 2x our own sample mass
# Mass given to statistics measured under an older topology (ADR-0021 "stale": a prior only).
STALE_MASS = 2.0
# Log-space spread of an arm known only by its advertised prior: x2 either way at 1 sigma.
PRIOR_SIGMA = 0.7
MAX_SIGMA = PRIOR_SIGMA  # a decayed arm is never less known than a never-seen one
# Posterior spread multiplier: Thompson sampling over-explores in practice and a narrower
# posterior earns more (Chapelle & Li, "An Empirical Evaluation of Thompson Sampling", 2011);
# measured in benchmarks/bench_learning.py.
SD_SCALE = 0.5
# Beliefs forget this many times slower than the shared statistics' half-life: time decay only
# re-opens routes not in use; drift of a route in use is caught by the change detectors.
BELIEF_HALF_LIFE_FACTOR = 6.0
# A route's log-speed is modelled as a random walk: its variance grows by this much per second
# since the route's last sample, so a route left alone is re-tried and one that got faster is
# found (8-recovery) at a small cost in stationary scenarios (bench_learning.py).
DRIFT_VAR_PER_S = 1e-6
# ... and by this much per outcome observed on the route's model since then (one per
# decision): what is re-learnt after a change is counted in requests, so a busy gateway
# re-tries in fewer seconds (tuned on the tuning seeds: bench_learning.py).
DRIFT_VAR_PER_DECISION = 2e-4
# Unused routes' results count for less as decisions go by (halved after 100), so a route
# that failed is re-tried and found when it recovers.
RESULT_DRIFT_PER_DECISION = 0.01
MAX_TRACKED = 4096  # arms kept before old ones are pruned
# Answer tokens assumed while a model's answers are unknown (affinity: the time a request
# spends decoding beside what its prefill costs).
DEFAULT_ANSWER_TOKENS = 256.0
# The drift's share on a request that is warm on some route: none (see ThompsonPolicy.choose).
WARM_DRIFT = 0.0
# ... and the share of its batch neighbours' loss it counts (NEIGHBOUR_WEIGHT otherwise):
# moving a warm conversation costs its prefill, which outweighs a neighbour's few percent.
# 0.25 measured best of {0, 0.25, 0.5, 0.8, 1} on the conversation scenarios 15-19 (tuning
# seeds 1-4, docs/benchmarks.md): mean TTFT 1.01-1.02x the oracle's on 15, 16, 18, 19 against
# 1.03-1.04x at 0.5; 0 queues on a saturated warm node (scenario 17: 4.6x).
CONVERSATION_NEIGHBOUR_WEIGHT = 0.25
# A request with a prompt that no route holds (a new conversation, a one-shot) goes to the
# route with the fewest in flight among those whose score is within this share of the best
# (SGLang's router places new prompts on the least loaded worker): on equal routes the
# posterior's noise alone would pick, and a busier route's neighbours pay for it later.
# 0.05 of {0.02, 0.05, 0.08, 0.1, 0.2} on the conversation scenarios (tuning seeds 1-4,
# docs/benchmarks.md): 15 and 18 at 0.999 of the oracle (0.994, 0.996 without); 0.1-0.2
# give up 19's one-shots (0.97-0.98).
COLD_BAND = 0.05
# ... and before any route's speed was measured (a cold start: every speed and batch is a
# prior) among those advertised at this share of the fastest's speed or more: scenario
# 17's 16 conversations arrive before any answer, and placing them by the prior's draws
# queued them on the fast node's small batch (docs/benchmarks/engine.md); a route
# advertised at a fifth of the others' speed is not handed a third of the first
# conversations, each paying its first prefill there (bench_realtime.py's slow-a). A quarter
# of {half, a quarter, all}: 17 at 1.034x / 1.025x / 1.021x the oracle's TTFT, 19 at
# 0.981 / 0.988 / 0.987 of its tokens/s (seeds 1-10).
COLD_START_SHARE = 0.25


class ThompsonPolicy:
    """Thompson sampling on saturation curves × reliability; the best net goodput wins."""

    name: ClassVar[str] = "thompson"

    def __init__(self, half_life_s: float = HALF_LIFE_S * BELIEF_HALF_LIFE_FACTOR,
                 min_sample_tokens: int = MIN_SAMPLE_TOKENS, affinity: bool = True) -> None:
        self.half_life_s = half_life_s  # of this policy's own beliefs
        self.min_sample_tokens = min_sample_tokens
        # Prefix-cache affinity (issue 26): for a request that carries its prompt's message
        # chain, the route's expected prefill of the uncached part counts against it, and its
        # speed samples leave the prefill out. False: today's policy, blind to prompts.
        self.affinity = affinity
        self._first = FirstTokens()  # prefill and waits for a slot, from first tokens
        self._beliefs: dict[str, ArmBelief] = {}
        # Outcomes observed per model: the clock of the per-decision drift. Counted in
        # observe, not choose, so that a display estimate (many draws) changes nothing.
        self._outcomes: dict[str, int] = {}
        # Per model, what its answers' lengths are given their max_tokens: what a re-try
        # costs on this request (the drift's variance goes where answers are short).
        self._lengths: dict[str, AnswerLengths] = {}
        # Per route, the peers' merged curve summaries (gossip) and the belief fitted to them.
        self._priors: dict[str, tuple[Curve, CurveBelief]] = {}

    @classmethod
    def from_config(cls, config: RouterConfig) -> ThompsonPolicy:
        """The policy for a router config (beliefs forget slower than the shared stats)."""
        return cls(config.half_life_s * BELIEF_HALF_LIFE_FACTOR, config.min_sample_tokens)

    @classmethod
    def blind(cls, config: RouterConfig) -> ThompsonPolicy:
        """The policy as it was before prefix-cache affinity (a benchmark baseline)."""
        return cls(config.half_life_s * BELIEF_HALF_LIFE_FACTOR, config.min_sample_tokens,
                   affinity=False)

    def expected_ttft(self, arm: Arm) -> float | None:
        """Seconds to this request's first token on the route by its learned prefill (the
        `ttft` objective, core/objectives.py); None without affinity, a prompt or a measure."""
        return self._first.expected_ttft(arm) if self.affinity else None

    def choose(self, arms: Sequence[Arm], now: float,
               rng: random.Random) -> tuple[int, DecisionMode]:
        """Try an untried arm first (best prior first; "greedy-fallback" while nothing at all
        is known, as ADR-0021); otherwise draw a curve and a reliability per arm and take the
        largest net goodput at the arm's current in-flight count."""
        best, best_score, untried, untried_prior = 0, -math.inf, -1, -1.0
        known = False  # whether any arm was ever measured (else: ADR-0021's cold start)
        decisions = self._outcomes.get(arms[0].route.model, 0) if arms else 0
        # The drift is shared out over the other routes: the share of decisions spent
        # re-trying stays the same however many routes there are.
        drift = DRIFT_VAR_PER_DECISION / max(len(arms) - 1, 1)
        lengths = self._lengths.get(arms[0].route.model) if arms else None
        cost = lengths.weight(arms[0].max_tokens) if lengths is not None else 1.0
        answer = 0.0  # > 0: score by expected time, prefill included
        warm_cost, weight = cost, NEIGHBOUR_WEIGHT
        band = 0.0
        if self.affinity and arms and arms[0].prefix is not None:
            expected = lengths.expected(arms[0].max_tokens) if lengths is not None else None
            answer = expected if expected is not None else DEFAULT_ANSWER_TOKENS
            if any(a.warm_tokens for a in arms):
                # Re-trying a route costs this request its warm prefix: routes are re-tried
                # on requests that are cold everywhere (new conversations, one-shots).
                warm_cost = cost * WARM_DRIFT
                weight = CONVERSATION_NEIGHBOUR_WEIGHT
            else:  # cold everywhere: the least loaded of the routes about as good
                band = COLD_BAND
        scores: list[tuple[float, int]] = []
        measured = False  # whether any of the routes' speeds was measured (band only)
        for i, arm in enumerate(arms):
            belief = self._beliefs.get(arm.route.signature)
            if (belief is not None and arm.origins > 1
                    and arm.view.mass > SHARED_DOMINATES * belief.mass + 1.0):
                belief = None  # peers (gossip) measured this route far more than we did
            if belief is None and not (arm.in_flight or arm.view.count
                                       or arm.view.status == STALE):
                if arm.prior_tps > untried_prior:
                    untried, untried_prior = i, arm.prior_tps
                continue
            known = True
            if answer:
                score = self.with_prefill(arm, self.draw(arm, belief, now, rng, decisions,
                                                         drift, warm_cost), answer, weight,
                                          self._first.wait_s(arm, None if belief is None
                                                             else belief.curve))
            else:
                score = self.score(arm, belief, now, rng, decisions, drift, cost)
            if band:
                scores.append((score, i))
                if (belief is not None and belief.curve.mass > 0.0) or arm.view.count:
                    measured = True  # by us, or by peers (gossip)
            if score > best_score:
                best, best_score = i, score
        if untried >= 0:
            return untried, (SCOUT if known else GREEDY)
        if band and best_score > 0.0:  # fewest in flight, then the best score, wins
            if measured:
                floor = best_score * (1.0 - band)
                best = min((arms[i].in_flight, -sc, i) for sc, i in scores if sc >= floor)[2]
            else:  # a cold start: by the advertised speeds, not draws of x2 spread
                floor = max(arms[i].prior_tps for _, i in scores) * COLD_START_SHARE
                best = min((arms[i].in_flight, -sc, i) for sc, i in scores
                           if arms[i].prior_tps >= floor)[2]
        return best, EXPLOIT

    def score(self, arm: Arm, belief: ArmBelief | None, now: float, rng: random.Random,
              decisions: int = 0, drift_per_decision: float = DRIFT_VAR_PER_DECISION,
              cost_weight: float = 1.0) -> float:
        """One posterior draw of a request's net goodput on this arm (`gain` × reliability)."""
        p, s1, j = self.draw(arm, belief, now, rng, decisions, drift_per_decision, cost_weight)
        n = arm.in_flight
        if not n:
            return p * s1
        slots = arm.route.slots
        return p * gain(s1, j, n, slots is not None and n >= slots)

    def draw(self, arm: Arm, belief: ArmBelief | None, now: float, rng: random.Random,
             decisions: int = 0, drift_per_decision: float = DRIFT_VAR_PER_DECISION,
             cost_weight: float = 1.0) -> tuple[float, float, int]:
        """One posterior draw of the arm's reliability, speed alone (s1) and curve."""
        n = arm.in_flight
        curve = belief.curve if belief is not None else None
        knee = slots_knee(arm.route.slots)  # the server's announced batch: the knee's prior
        if curve is not None:
            curve.set_knee(knee)
        if belief is not None and curve is not None and curve.mass > 0.0:
            dt = now - belief.t
            if dt < 0.0:  # a wall clock that stepped back: no decay
                dt = 0.0
            d = math.exp(-LN2 * dt / self.half_life_s) if dt else 1.0  # decay_factor
            mass = curve.mass * d
            if arm.stale:
                mass = min(mass, STALE_MASS)  # measured under an older topology: a prior only
            _, mus, best, sigma = curve.posterior()
            # With nothing in flight every curve says s1: no curve draw needed (the MAP's s1).
            j = curve.draw(rng) if n else best
            since = decisions - belief.decision
            drift = cost_weight * (DRIFT_VAR_PER_S * dt
                                   + drift_per_decision * (since if since > 0 else 0))
            unit = SD_SCALE * sigma
            sd = math.sqrt(unit * unit / mass + drift)
            log_s1 = mus[j] + (sd if sd < MAX_SIGMA else MAX_SIGMA) * rng.gauss(0.0, 1.0)
            since = decisions - belief.result_decision
            r = d / (1.0 + RESULT_DRIFT_PER_DECISION * (since if since > 0 else 0))
            ok, fail = belief.ok * r, belief.fail * r
        else:
            mu, sd = self._shared_prior(arm)
            prior = self._shared_curve(arm)
            if prior is None:
                j = prior_draw(rng, knee) if n else 0
            else:  # the peers' curve: their knee, and the speed at one request it implies
                prior.set_knee(knee)
                _, mus, best, _ = prior.posterior()
                j = prior.draw(rng) if n else best
                mu = mus[j]
            log_s1 = mu + sd * rng.gauss(0.0, 1.0)
            if belief is None:
                ok, fail = arm.view.ok, arm.view.fail
            else:
                d = decay_factor(max(now - belief.t, 0.0), self.half_life_s)
                ok, fail = belief.ok * d, belief.fail * d
        if fail > NO_FAILURES:
            p = reliability(ok, fail, rng)
        else:  # reliability's mean, without the call (most routes never failed lately)
            a = PRIOR_OK + ok
            p = a / (a + (PRIOR_FAIL + fail))
        return p, math.exp(log_s1), j


    def with_prefill(self, arm: Arm, drawn: tuple[float, float, int],
                     answer_tokens: float, weight: float = NEIGHBOUR_WEIGHT,
                     wait: tuple[float | None, float] = (None, 0.0)) -> float:
        """The net goodput of `score` with the request's own speed counting its expected
        time to first token (`first_token.FirstTokens.score`)."""
        return self._first.score(arm, drawn, answer_tokens, weight, wait)

    @staticmethod
    def _shared_prior(arm: Arm) -> tuple[float, float]:
        """Log-tps prior from the shared (gossiped) view, else from the advertised prior."""
        view = arm.view
        if view.tps is not None and view.tps > 0:
            fresh = view.status in (PROVEN, DECAYED)  # else stale: an older topology's
            mass = min(max(view.mass, 1.0), 200.0) if fresh else 1.0
            return math.log(view.tps), OBS_SIGMA / math.sqrt(mass)
        return math.log(max(arm.prior_tps, 1e-6)), PRIOR_SIGMA

    def _shared_curve(self, arm: Arm) -> CurveBelief | None:
        """The belief fitted to the origins' merged curve summaries (None if none shares
        one); refitted unless `alike` the one it was fitted to."""
        curve = arm.curve
        if not curve:
            return None
        cached = self._priors.get(arm.route.signature)
        if cached is not None and (cached[0] is curve or alike(cached[0], curve)):
            return cached[1]
        if len(self._priors) >= MAX_TRACKED:
            self._priors.clear()
        prior = CurveBelief.from_summary(curve)
        self._priors[arm.route.signature] = (curve, prior)
        return prior

    def curve_summary(self, signature: str) -> Curve | None:
        """This tracker's curve of one route as its statistics entry shares it (gossip);
        None before its first tps sample. Redone after a change, else once the samples
        since exceed REFIT_SHARE of the mass, as the fit is (a summary costs ~10-40 µs,
        a record ~20 µs)."""
        belief = self._beliefs.get(signature)
        if belief is None or belief.curve.mass <= 0.0:
            return None
        curve, shared = belief.curve, belief.shared
        if (shared is None or shared[0] != curve.changes
                or curve.samples - shared[1] > REFIT_SHARE * curve.mass):
            shared = belief.shared = (curve.changes, curve.samples, curve.summary())
        return shared[2]

    def estimate(self, signature: str) -> float | None:
        """This policy's own estimate of a route's tokens/s with one request in flight (its
        curves' s1, geometric mean over their posterior), for display; None before its first
        tps sample. Unlike the shared decayed mean (ADR-0021), it moves as soon as a change is
        detected. The posterior mean, not the best fit: while the samples cannot tell the
        curves apart (one concurrency seen, say) the best fit is an arbitrary one of them."""
        belief = self._beliefs.get(signature)
        if belief is None or belief.curve.mass <= 0.0:
            return None
        cum, mus, _, _ = belief.curve.peek()  # a display: no refit is kept
        below = weighted = 0.0
        for upto, mu in zip(cum, mus, strict=True):
            weighted += (upto - below) * mu
            below = upto
        return math.exp(weighted / cum[-1])

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """Learn from a finished request: a tps sample at its concurrency, or a success or
        failure only."""
        belief = self._beliefs.get(signature)
        if belief is None:
            if len(self._beliefs) >= MAX_TRACKED:
                self._prune(now)
            model = signature.split("|", 1)[0]
            belief = self._beliefs[signature] = ArmBelief(t=now, model=model)
        count = self._outcomes[belief.model] = self._outcomes.get(belief.model, 0) + 1
        belief.decay(now, self.half_life_s)
        belief.add_result(outcome.ok)
        belief.result_decision = count
        tps = outcome.tps  # the one tokens/s rule: capped at MAX_TPS, None if unmeasurable
        if self.affinity and outcome.uncached_tokens >= 0 and outcome.ok:
            tps = self._first.learn(belief.model, signature, outcome)
        lengths = self._lengths.get(belief.model)
        if lengths is None:
            lengths = self._lengths[belief.model] = AnswerLengths()
        lengths.add(outcome.max_tokens, outcome.completion_tokens if outcome.ok else 0)
        if outcome.ok and outcome.completion_tokens >= self.min_sample_tokens and tps is not None:
            concurrency = outcome.concurrency if outcome.concurrency >= 1.0 else 1.0
            belief.curve.add(tps, concurrency)
            belief.decision = count



    def _prune(self, now: float) -> None:
        """Forget the half of the arms updated longest ago."""
        ordered = sorted(self._beliefs, key=lambda s: self._beliefs[s].t)
        for signature in ordered[: len(ordered) // 2]:
            del self._beliefs[signature]
        self._first.forget(ordered[: len(ordered) // 2])
