"""The peers' route-selection rules, re-implemented as policies for side-by-side benchmarks.

Each follows the published behaviour of its reference as closely as a route bandit allows; the
docstrings say where a rule had to be adapted. They are selectable by name like any policy.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Sequence
from typing import ClassVar

from .policies import EXPLOIT, GREEDY, SCOUT, Arm, Outcome, best_prior
from .stats import DECAYED, PROVEN

EPSILON = 0.1  # the textbook epsilon-greedy rate (Sutton & Barto, ch. 2)
LITELLM_WINDOW = 10  # LiteLLM lowest_latency: keeps the last 10 latencies per deployment
LITELLM_TIMEOUT_S = 1000.0  # LiteLLM lowest_latency: a timeout is logged as 1000 s latency
# FreeLLMAPI published constants (DESIGN.md "Multi-objective scoring"): balanced preset.
W_RELIABILITY, W_SPEED, W_INTELLIGENCE = 0.5, 0.25, 0.25
SPEED_TPS_SCALE = 60.0  # speed = 1 - exp(-tps / 60)
SPEED_PRIOR = 0.6  # speed score without data
TTFB_GOOD_MS, TTFB_BAD_MS = 300.0, 5000.0


def _measured(arm: Arm) -> float | None:
    """The learned tps of an arm measured under the current topology, else None."""
    v = arm.view
    if v.tps is not None and v.status in (PROVEN, DECAYED):
        return v.tps
    return None


class EpsilonGreedyPolicy:
    """With probability epsilon a uniformly random arm, else the highest learned tps."""

    name: ClassVar[str] = "epsilon-greedy"

    def __init__(self, epsilon: float = EPSILON) -> None:
        self.epsilon = epsilon

    def choose(self, arms: Sequence[Arm], now: float, rng: random.Random) -> tuple[int, str]:
        """Explore uniformly, or exploit the best measured arm (best prior before any)."""
        if rng.random() < self.epsilon:
            return rng.randrange(len(arms)), SCOUT
        best, best_tps = -1, -1.0
        for i, arm in enumerate(arms):
            tps = _measured(arm)
            if tps is not None and tps > best_tps:
                best, best_tps = i, tps
        if best < 0:
            return best_prior(arms), GREEDY
        return best, EXPLOIT

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """Reads only the shared statistics."""


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

    def choose(self, arms: Sequence[Arm], now: float, rng: random.Random) -> tuple[int, str]:
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
        elif outcome.error == "timeout":
            value = LITELLM_TIMEOUT_S
        else:
            return
        self._latency.setdefault(signature, deque(maxlen=self.window)).append(value)


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

    def choose(self, arms: Sequence[Arm], now: float, rng: random.Random) -> tuple[int, str]:
        """The arm with the smallest advertised seconds per token."""
        costs = [advertised_seconds_per_token(a) for a in arms]
        return costs.index(min(costs)), GREEDY

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """Petals does not learn from outcomes."""


def ttfb_score(ttfb_s: float | None) -> float:
    """FreeLLMAPI: 1 at <= 300 ms, 0 at >= 5000 ms, linear between; neutral without data."""
    if ttfb_s is None:
        return SPEED_PRIOR
    ms = ttfb_s * 1000.0
    return min(1.0, max(0.0, (TTFB_BAD_MS - ms) / (TTFB_BAD_MS - TTFB_GOOD_MS)))


def speed_score(arm: Arm) -> float:
    """FreeLLMAPI speed: 0.6·(1−e^(−tps/60)) + 0.4·ttfb score; 0.6 without data."""
    tps = _measured(arm)
    if tps is None:
        return SPEED_PRIOR
    return 0.6 * (1.0 - math.exp(-tps / SPEED_TPS_SCALE)) + 0.4 * ttfb_score(arm.view.ttfb_s)


class ScorePolicy:
    """FreeLLMAPI-style: convex score of a Thompson-sampled Beta(1,1) reliability, speed and
    intelligence (equal for every route here), balanced weights; the highest score wins.
    Headroom and rate-limit factors are 1 (no provider limits on a mesh)."""

    name: ClassVar[str] = "freellmapi"

    def choose(self, arms: Sequence[Arm], now: float, rng: random.Random) -> tuple[int, str]:
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
