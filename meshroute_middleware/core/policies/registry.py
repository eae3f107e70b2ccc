"""Policies by name: what config `policy` and CLI `--policy` select from."""

from __future__ import annotations

from collections.abc import Callable

from ..config import RouterConfig
from .adr0021 import Adr0021Policy
from .base import Policy
from .cache_rules import CacheAwarePolicy, LeastLoadedPolicy, SessionStickyPolicy
from .epsilon_greedy import EpsilonGreedyPolicy
from .freellmapi import ScorePolicy
from .litellm import LowestLatencyPolicy
from .petals import PetalsPolicy
from .thompson import ThompsonPolicy

PolicyFactory = Callable[[RouterConfig], Policy]

POLICIES: dict[str, PolicyFactory] = {
    "adr0021": lambda c: Adr0021Policy(c.explore_share, c.weight_alpha),
    "thompson": lambda c: ThompsonPolicy.from_config(c),
    # Issue 26's baselines for conversations: today's thompson (blind to prompts) and the
    # rules of self-hosted routers.
    "thompson-blind": lambda c: ThompsonPolicy.blind(c),
    "session-sticky": lambda c: SessionStickyPolicy(),
    "least-loaded": lambda c: LeastLoadedPolicy(),
    "sglang-cache": lambda c: CacheAwarePolicy(),
    "epsilon-greedy": lambda c: EpsilonGreedyPolicy(),
    "litellm-latency": lambda c: LowestLatencyPolicy(),
    "petals": lambda c: PetalsPolicy(),
    "freellmapi": lambda c: ScorePolicy(),
}


def register_policy(name: str, factory: PolicyFactory) -> None:
    """Make a policy selectable by name (config `policy`, CLI `--policy`)."""
    POLICIES[name] = factory


def make_policy(config: RouterConfig) -> Policy:
    """The policy the config names; ValueError listing the known names otherwise."""
    try:
        return POLICIES[config.policy](config)
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise ValueError(f"unknown policy {config.policy!r}; known: {known}") from None
