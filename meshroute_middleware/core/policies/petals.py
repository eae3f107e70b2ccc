"""Petals-style deterministic routing by advertised throughput, for side-by-side benchmarks."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import ClassVar

from ..kinds import GREEDY, DecisionMode
from .base import Arm, Outcome


def advertised_seconds_per_token(arm: Arm) -> float:
    """Petals-style expected time per token: each hop's share of its node's advertised,
    queue-adjusted throughput (seconds per token for the layers it runs), summed."""
    total = 0.0
    for hop in arm.route.hops:
        node = hop.node
        span = node.end - node.start + 1
        used = hop.end_layer - hop.start_layer + 1
        total += used / (span * max(node.effective_tps, 1e-9))
    return total


class PetalsPolicy:
    """Petals-style deterministic routing: the route of least expected latency computed from
    the nodes' advertised throughput; never explores, never learns."""

    name: ClassVar[str] = "petals"

    def choose(self, arms: Sequence[Arm], now: float,
               rng: random.Random) -> tuple[int, DecisionMode]:
        """The arm with the smallest advertised seconds per token."""
        costs = [advertised_seconds_per_token(a) for a in arms]
        return costs.index(min(costs)), GREEDY

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """Petals does not learn from outcomes."""
