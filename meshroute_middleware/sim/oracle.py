"""The oracle: a policy handed the simulator's ground truth (true current speeds and queues)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from ..core.policies import EXPLOIT, Arm, Mode, Outcome
from ..core.routes import Route

if TYPE_CHECKING:
    from .engine import Simulator

# A decision is "good" when its route's expected cost is within 5 % of the oracle's best
# (docs/benchmarks.md, "Learning quality": the re-convergence metric).
GOOD_WITHIN = 0.05


class OraclePolicy:
    """Picks the route of least expected mesh time per delivered request, knowing every
    route's true current speed, failure rate and queue: greedy shortest expected delay."""

    name: ClassVar[str] = "oracle"

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim

    def choose(self, arms: Sequence[Arm], now: float, rng: random.Random) -> tuple[int, Mode]:
        """The arm whose route has the smallest expected cost for the current request."""
        req = self.sim.current
        tokens = req.tokens if req is not None else 1
        return best_route([a.route for a in arms], self.sim, tokens), EXPLOIT

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """The oracle needs no learning."""


def best_route(routes: Sequence[Route], sim: Simulator, tokens: int) -> int:
    """Index of the route with the least expected cost (the first on a tie)."""
    costs = [sim.expected_cost_s(r, tokens) for r in routes]
    return costs.index(min(costs))
