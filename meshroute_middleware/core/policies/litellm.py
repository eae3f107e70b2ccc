"""LiteLLM's `latency-based-routing` rule as a route policy, for side-by-side benchmarks."""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence
from typing import ClassVar

from ..kinds import EXPLOIT, SCOUT, TIMEOUT, DecisionMode
from .base import Arm, Outcome

LITELLM_WINDOW = 10  # LiteLLM lowest_latency: keeps the last 10 latencies per deployment
LITELLM_TIMEOUT_S = 1000.0  # LiteLLM lowest_latency: a timeout is logged as 1000 s latency


class LowestLatencyPolicy:
    """LiteLLM `latency-based-routing`: lowest mean seconds per output token over the last 10
    requests, untried deployments first, lowest_latency_buffer 0 (no random spread).

    As in LiteLLM, only a timeout counts against a deployment (as 1000 s); other failures are
    not recorded. LiteLLM's cache TTL (1 h, refreshed by every request) never lapses under
    steady traffic, so it is not modelled.
    """

    name: ClassVar[str] = "litellm-latency"

    def __init__(self, window: int = LITELLM_WINDOW) -> None:
        self.window = window
        self._latency: dict[str, deque[float]] = {}

    def choose(self, arms: Sequence[Arm], now: float,
               rng: random.Random) -> tuple[int, DecisionMode]:
        """The first untried arm, else the lowest mean seconds per token."""
        best, best_s = 0, math.inf
        for i, arm in enumerate(arms):
            samples = self._latency.get(arm.signature)
            if not samples:
                return i, SCOUT
            mean_s = sum(samples) / len(samples)
            if mean_s < best_s:
                best, best_s = i, mean_s
        return best, EXPLOIT

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """Log seconds per output token of a success, 1000 s for a timeout."""
        if outcome.ok and outcome.completion_tokens > 0:
            value = outcome.seconds / outcome.completion_tokens
        elif outcome.error == TIMEOUT:
            value = LITELLM_TIMEOUT_S
        else:
            return
        self._latency.setdefault(signature, deque(maxlen=self.window)).append(value)
