"""Multi-objective route scoring (the FreeLLMAPI seed and its published constants).

score = convex(weights; reliability, speed, intelligence, price) × headroom × rate-limit factor.
Every axis is on a FIXED scale in [0, 1], so adding a model to a chain never moves the scores of
the others (the seed's min–max intelligence did). Pure: `now` and `rng` come in.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from enum import Enum

from ..defaults import SPEED_PRIOR

# -- constants (the FreeLLMAPI seed's multi-objective scoring) --------------------------------
PRIOR_OK = 1.0  # Beta(1, 1) prior on reliability
PRIOR_FAIL = 1.0
TPS_SCALE = 60.0  # throughput score 1 − e^(−tps/60)
TPS_WEIGHT, TTFB_WEIGHT = 0.6, 0.4
TTFB_BEST_MS, TTFB_WORST_MS = 300.0, 5000.0  # ttfb score 1 at ≤300 ms, 0 at ≥5000 ms
HEADROOM_KNEE = 0.2  # headroom factor is 1 while ≥20 % of the monthly budget remains…
HEADROOM_FLOOR = 0.1  # …then falls linearly to 0.1 at an exhausted budget
PENALTY_429, PENALTY_FAILURE, PENALTY_SUCCESS = 3.0, 1.0, -1.0
PENALTY_CAP = 10.0
PENALTY_DECAY_PER_S = 1.0 / 120.0  # one point per two minutes
PENALTY_MAX_CUT = 0.6  # factor 1 − 0.6·penalty/10

# Intelligence on a fixed scale by tier (not min–max over the chain: ours never moves).
TIER_SCORE = {"frontier": 1.0, "large": 0.75, "medium": 0.5, "small": 0.25}

# Price axis: blended USD per million tokens, weighted like input-heavy chat traffic
# (3 prompt tokens per completion token), scored 1 / (1 + blended / PRICE_REF_USD_PER_M):
# free → 1, $1/M → 0.5, $3/M → 0.25. Fixed, so a new model moves no other score.
PRICE_IN_SHARE = 0.75
PRICE_REF_USD_PER_M = 1.0

# Learned counts are scaled down past this many outcomes, so an old record cannot outvote
# the last few hundred requests (the seed's counts grow forever).
RELIABILITY_WINDOW = 200.0
# Speed is drawn from a Beta posterior around the measured speed score whose weight is
# SPEED_PRIOR_WEIGHT + the route's successes (at most SPEED_WINDOW): an untried route draws
# about uniformly around the prior 0.6, so under `fastest` it is tried and learned even
# beside a measured route that scores higher (issue 26); a measured one draws close to its
# expected score, which the chain view shows.
SPEED_PRIOR_WEIGHT = 2.0
SPEED_WINDOW = 200.0
EWMA_ALPHA = 0.2  # weight of the newest tps/ttfb sample
# The `ttft` objective's axis (issue 26): 1 / (1 + ttfb / 1 s), so 250 ms → 0.8, 1 s → 0.5,
# 5 s → 0.17; finer than the speed axis's ttfb part, which is 1 for anything under 300 ms.
# An unmeasured route scores SPEED_PRIOR (~670 ms), drawn as sample_speed draws.
FIRST_TOKEN_REF_MS = 1000.0


@dataclass(frozen=True, slots=True)
class Weights:
    """A strategy's weights on the four axes; combined as a convex combination."""

    reliability: float
    speed: float
    intelligence: float
    price: float = 0.0


# FreeLLMAPI's presets (reliability/speed/intelligence). `cheapest` is ours: price dominates, so a
# free route outranks a $1/M one even when the free one has failed every time and the paid one
# never (0.7·(1 − 0.5) = 0.35 > 0.2 + 0.05 + 0.05); reliability still separates routes of the
# same price, and speed and tier break the remaining ties.
STRATEGY_WEIGHTS: dict[str, Weights] = {
    "balanced": Weights(0.5, 0.25, 0.25),
    "fastest": Weights(0.35, 0.55, 0.1),
    "reliable": Weights(0.7, 0.15, 0.15),
    "smartest": Weights(0.35, 0.1, 0.55),
    "cheapest": Weights(0.2, 0.05, 0.05, 0.7),
}

# The strategy without a score (issue 24): the chain's written order, each route passed over
# while it cannot be used (its gates, a cooldown, its context); outcomes are still recorded.
PRIORITY = "priority"

# `auto:<alias>` → strategy over every enabled route (issue 12); `auto:priority`: every route
# in the config file's order (providers as written, each one's models as written, then the
# mesh models by name).
AUTO_ALIASES: dict[str, str] = {
    "fast": "fastest", "fastest": "fastest", "speed": "fastest", "smart": "smartest",
    "smartest": "smartest", "reliable": "reliable", "balanced": "balanced",
    "cheap": "cheapest", "cheapest": "cheapest", PRIORITY: PRIORITY,
}


class OutcomeKind(Enum):
    """What one attempt says about the route (not about the client)."""

    SUCCESS = "success"
    RATE_LIMITED = "rate_limited"  # HTTP 429
    FAILURE = "failure"  # 5xx, timeout, connect error, broken stream
    CLIENT_ERROR = "client_error"  # the client's own 4xx: counts against nobody


def classify_status(status: int) -> OutcomeKind:
    """Map an upstream HTTP status to its effect on the route."""
    if status == 429:
        return OutcomeKind.RATE_LIMITED
    if 200 <= status < 400:
        return OutcomeKind.SUCCESS
    if 400 <= status < 500:
        return OutcomeKind.CLIENT_ERROR
    return OutcomeKind.FAILURE


def expected_reliability(ok: float, fail: float) -> float:
    """Mean of the Beta(1 + ok, 1 + fail) posterior: what the dashboard shows."""
    return (PRIOR_OK + ok) / (PRIOR_OK + ok + PRIOR_FAIL + fail)


def sample_reliability(ok: float, fail: float, rng: random.Random) -> float:
    """One Thompson draw from the Beta(1 + ok, 1 + fail) posterior: what routing uses."""
    return rng.betavariate(PRIOR_OK + ok, PRIOR_FAIL + fail)


def throughput_score(tokens_per_s: float) -> float:
    return 1.0 - math.exp(-max(tokens_per_s, 0.0) / TPS_SCALE)


def ttfb_score(ttfb_ms: float) -> float:
    span = TTFB_WORST_MS - TTFB_BEST_MS
    return min(1.0, max(0.0, (TTFB_WORST_MS - ttfb_ms) / span))


def speed_score(tokens_per_s: float | None, ttfb_ms: float | None) -> float:
    """0.6·throughput + 0.4·ttfb; the prior 0.6 stands in for whichever part is unmeasured."""
    if tokens_per_s is None and ttfb_ms is None:
        return SPEED_PRIOR
    tps = SPEED_PRIOR if tokens_per_s is None else throughput_score(tokens_per_s)
    first = SPEED_PRIOR if ttfb_ms is None else ttfb_score(ttfb_ms)
    return TPS_WEIGHT * tps + TTFB_WEIGHT * first


def sample_speed(tokens_per_s: float | None, ttfb_ms: float | None, successes: float,
                 rng: random.Random) -> float:
    """One Thompson draw of the speed score: Beta around `speed_score`, as sure as the
    successes that measured it."""
    mean = min(max(speed_score(tokens_per_s, ttfb_ms), 1e-3), 1.0 - 1e-3)
    weight = SPEED_PRIOR_WEIGHT + min(max(successes, 0.0), SPEED_WINDOW)
    return rng.betavariate(mean * weight, (1.0 - mean) * weight)


def first_token_score(ttfb_ms: float | None) -> float:
    """The `ttft` objective's axis: 1 / (1 + ttfb / FIRST_TOKEN_REF_MS); the prior 0.6
    while unmeasured."""
    if ttfb_ms is None:
        return SPEED_PRIOR
    return 1.0 / (1.0 + max(ttfb_ms, 0.0) / FIRST_TOKEN_REF_MS)


def sample_first_token(ttfb_ms: float | None, successes: float, rng: random.Random) -> float:
    """One Thompson draw of the first-token score, as sure as the successes that measured
    it (an untried route is tried beside a measured one, as under sample_speed)."""
    mean = min(max(first_token_score(ttfb_ms), 1e-3), 1.0 - 1e-3)
    weight = SPEED_PRIOR_WEIGHT + min(max(successes, 0.0), SPEED_WINDOW)
    return rng.betavariate(mean * weight, (1.0 - mean) * weight)


def intelligence_score(tier: str) -> float:
    return TIER_SCORE[tier]


def price_score(price_in: float, price_out: float) -> float:
    blended = PRICE_IN_SHARE * price_in + (1.0 - PRICE_IN_SHARE) * price_out
    return 1.0 / (1.0 + max(blended, 0.0) / PRICE_REF_USD_PER_M)


def headroom_factor(used_tokens: float, budget_tokens: int | None) -> float:
    """1 while ≥20 % of the monthly budget remains, then linear down to 0.1 at none left."""
    if budget_tokens is None or budget_tokens <= 0:
        return 1.0
    remaining = max(0.0, 1.0 - used_tokens / budget_tokens)
    if remaining >= HEADROOM_KNEE:
        return 1.0
    return HEADROOM_FLOOR + (1.0 - HEADROOM_FLOOR) * remaining / HEADROOM_KNEE


def decayed_penalty(penalty: float, since_s: float) -> float:
    return max(0.0, penalty - max(since_s, 0.0) * PENALTY_DECAY_PER_S)


def rate_limit_factor(penalty: float) -> float:
    return 1.0 - PENALTY_MAX_CUT * min(penalty, PENALTY_CAP) / PENALTY_CAP


def combine(weights: Weights, reliability: float, speed: float, intelligence: float,
            price: float, headroom: float, rate_limit: float) -> float:
    """The seed's combineScore, with the price axis added."""
    total = weights.reliability + weights.speed + weights.intelligence + weights.price or 1.0
    base = (weights.reliability * reliability + weights.speed * speed
            + weights.intelligence * intelligence + weights.price * price) / total
    return base * headroom * rate_limit


@dataclass(slots=True)
class RouteStats:
    """What one route (a provider model or a mesh model) has taught us. Plain, snapshottable."""

    ok: float = 0.0
    fail: float = 0.0
    tokens_per_s: float | None = None  # EWMA of measured output throughput
    ttfb_ms: float | None = None  # EWMA of time to first byte
    penalty: float = 0.0  # rate-limit penalty as of `penalty_at`
    penalty_at: float = 0.0

    def penalty_now(self, now: float) -> float:
        return decayed_penalty(self.penalty, now - self.penalty_at)

    def record(self, kind: OutcomeKind, now: float, tokens_per_s: float | None = None,
               ttfb_ms: float | None = None) -> None:
        """Fold one attempt's outcome in; a client error changes nothing."""
        if kind is OutcomeKind.CLIENT_ERROR:
            return
        step = {OutcomeKind.SUCCESS: PENALTY_SUCCESS, OutcomeKind.RATE_LIMITED: PENALTY_429,
                OutcomeKind.FAILURE: PENALTY_FAILURE}[kind]
        self.penalty = min(PENALTY_CAP, max(0.0, self.penalty_now(now) + step))
        self.penalty_at = now
        if kind is OutcomeKind.SUCCESS:
            self.ok += 1.0
            self.tokens_per_s = _ewma(self.tokens_per_s, tokens_per_s)
            self.ttfb_ms = _ewma(self.ttfb_ms, ttfb_ms)
        else:
            self.fail += 1.0
        total = self.ok + self.fail
        if total > RELIABILITY_WINDOW:
            self.ok *= RELIABILITY_WINDOW / total
            self.fail *= RELIABILITY_WINDOW / total

    def clear_penalty(self) -> None:
        self.penalty = 0.0

    def to_dict(self) -> dict[str, float | None]:
        return {"ok": self.ok, "fail": self.fail, "tokens_per_s": self.tokens_per_s,
                "ttfb_ms": self.ttfb_ms, "penalty": self.penalty, "penalty_at": self.penalty_at}

    @classmethod
    def from_dict(cls, data: dict[str, float | None]) -> RouteStats:
        def num(key: str) -> float:
            value = data.get(key)
            return float(value) if isinstance(value, int | float) else 0.0

        def opt(key: str) -> float | None:
            value = data.get(key)
            return float(value) if isinstance(value, int | float) else None

        return cls(num("ok"), num("fail"), opt("tokens_per_s"), opt("ttfb_ms"),
                   num("penalty"), num("penalty_at"))


def _ewma(old: float | None, sample: float | None) -> float | None:
    if sample is None or not math.isfinite(sample) or sample < 0:
        return old
    return sample if old is None else old + EWMA_ALPHA * (sample - old)
