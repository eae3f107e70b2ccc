"""ε-greedy, the textbook bandit baseline (Sutton & Barto, ch. 2), for side-by-side benchmarks."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from ..kinds import EXPLOIT, GREEDY, SCOUT, DecisionMode
from .base import Arm, Outcome, best_prior, measured_tps

EPSILON = 0.1  # the textbook epsilon-greedy rate (Sutton & Barto, ch. 2)


class EpsilonGreedyPolicy:
    """With probability epsilon a uniformly random arm, else the highest learned tps."""

    name: ClassVar[str] = "epsilon-greedy"

    def __init__(self, epsilon: float = EPSILON) -> None:
        self.epsilon = epsilon

    def choose(self, arms: Sequence[Arm], now: float,
               rng: random.Random) -> tuple[int, DecisionMode]:
        """Explore uniformly, or exploit the best measured arm (best prior before any)."""
        if rng.random() < self.epsilon:
            return rng.randrange(len(arms)), SCOUT
        best, best_tps = -1, -1.0
        for i, arm in enumerate(arms):
            tps = measured_tps(arm)
            if tps is not None and tps > best_tps:
                best, best_tps = i, tps
        if best < 0:
            return best_prior(arms), GREEDY
        return best, EXPLOIT

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """Reads only the shared statistics."""
