"""FreeLLMAPI-style multi-objective scoring as a route policy, for side-by-side benchmarks."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import ClassVar

from ..defaults import SPEED_PRIOR
from ..kinds import EXPLOIT, DecisionMode
from .base import Arm, Outcome, measured_tps

# FreeLLMAPI published constants (its multi-objective scoring): the balanced preset.
W_RELIABILITY, W_SPEED, W_INTELLIGENCE = 0.5, 0.25, 0.25
SPEED_TPS_SCALE = 60.0  # speed = 1 - exp(-tps / 60)
TTFB_GOOD_MS, TTFB_BAD_MS = 300.0, 5000.0


def ttfb_score(ttfb_s: float | None) -> float:
    """FreeLLMAPI: 1 at <= 300 ms, 0 at >= 5000 ms, linear between; neutral without data."""
    if ttfb_s is None:
        return SPEED_PRIOR
    ms = ttfb_s * 1000.0
    return min(1.0, max(0.0, (TTFB_BAD_MS - ms) / (TTFB_BAD_MS - TTFB_GOOD_MS)))


def speed_score(arm: Arm) -> float:
    """FreeLLMAPI speed: 0.6·(1−e^(−tps/60)) + 0.4·ttfb score; 0.6 without data."""
    tps = measured_tps(arm)
    if tps is None:
        return SPEED_PRIOR
    return 0.6 * (1.0 - math.exp(-tps / SPEED_TPS_SCALE)) + 0.4 * ttfb_score(arm.view.ttfb_s)


class ScorePolicy:
    """FreeLLMAPI-style: convex score of a Thompson-sampled Beta(1,1) reliability, speed and
    intelligence (equal for every route here), balanced weights; the highest score wins.
    Headroom and rate-limit factors are 1 (no provider limits on a mesh)."""

    name: ClassVar[str] = "freellmapi"

    def choose(self, arms: Sequence[Arm], now: float,
               rng: random.Random) -> tuple[int, DecisionMode]:
        """Draw reliability per arm and take the best convex score."""
        best, best_score = 0, -math.inf
        for i, arm in enumerate(arms):
            reliability = rng.betavariate(1.0 + arm.view.ok, 1.0 + arm.view.fail)
            score = (W_RELIABILITY * reliability + W_SPEED * speed_score(arm)
                     + W_INTELLIGENCE * 1.0)
            if score > best_score:
                best, best_score = i, score
        return best, EXPLOIT

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """Reads only the shared statistics."""
