"""ADR-0021's policy exactly: scout a share of the traffic, exploit the rest by learned speed."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from ..defaults import EXPLORE_SHARE
from ..kinds import EXPLOIT, GREEDY, PROVEN, SCOUT, DecisionMode
from .base import (
    Arm,
    Outcome,
    best_prior,
    least_measured,
    weighted_index,
)


class Adr0021Policy:
    """ADR-0021 exactly: scout with probability explore_share, else exploit P ∝ tps^alpha."""

    name: ClassVar[str] = "adr0021"

    def __init__(self, explore_share: float = EXPLORE_SHARE, weight_alpha: float = 1.0) -> None:
        self.explore_share = explore_share
        self.weight_alpha = weight_alpha

    def choose(self, arms: Sequence[Arm], now: float,
               rng: random.Random) -> tuple[int, DecisionMode]:
        """Pick an arm as ADR-0021 does."""
        proven = [i for i, a in enumerate(arms) if a.view.status == PROVEN]
        if not proven:
            return best_prior(arms), GREEDY
        if len(proven) < len(arms) and rng.random() < self.explore_share:
            return least_measured(arms, [i for i, a in enumerate(arms) if not a.proven]), SCOUT
        return proven[weighted_index(self._weights(arms, proven), rng)], EXPLOIT

    def _weights(self, arms: Sequence[Arm], proven: Sequence[int]) -> list[float]:
        """tps^alpha of the proven arms (a floor keeps a zero-tps arm drawable)."""
        alpha = self.weight_alpha
        tps = [max(arms[i].view.tps or 0.0, 1e-9) for i in proven]
        return tps if alpha == 1.0 else [x**alpha for x in tps]

    def shares(self, arms: Sequence[Arm]) -> list[float]:
        """Expected traffic share of each arm under this policy right now."""
        proven = [i for i, a in enumerate(arms) if a.proven]
        out = [0.0] * len(arms)
        if not proven:
            out[best_prior(arms)] = 1.0
            return out
        explore = self.explore_share if len(proven) < len(arms) else 0.0
        if explore:
            out[least_measured(arms, [i for i, a in enumerate(arms) if not a.proven])] = explore
        weights = self._weights(arms, proven)
        total = sum(weights)
        for i, w in zip(proven, weights, strict=True):
            out[i] += (1 - explore) * w / total
        return out

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """ADR-0021 reads only the shared statistics."""
