"""Route-selection policies, one module each, behind one protocol and one registry.

- `base`: the `Policy` protocol, the `Arm` a policy chooses among, the `Outcome` it learns from;
- `registry`: policies by name (`make_policy`, `register_policy`);
- `thompson` (meshroute's own, the default), `adr0021` (ADR-0021 exactly), and the peers' rules
  re-implemented for side-by-side benchmarks: `epsilon_greedy`, `litellm`, `petals`,
  `freellmapi`.
"""

from .adr0021 import Adr0021Policy
from .base import (
    EXPLOIT,
    FALLBACK,
    GREEDY,
    PINNED,
    SCOUT,
    Arm,
    DecisionMode,
    Outcome,
    Policy,
    best_prior,
    least_measured,
    measured_tps,
    weighted_index,
)
from .epsilon_greedy import EpsilonGreedyPolicy
from .freellmapi import ScorePolicy
from .litellm import LowestLatencyPolicy
from .petals import PetalsPolicy
from .registry import POLICIES, PolicyFactory, make_policy, register_policy
from .thompson import ThompsonPolicy

__all__ = [
    "EXPLOIT",
    "FALLBACK",
    "GREEDY",
    "PINNED",
    "POLICIES",
    "SCOUT",
    "Adr0021Policy",
    "Arm",
    "DecisionMode",
    "EpsilonGreedyPolicy",
    "LowestLatencyPolicy",
    "Outcome",
    "PetalsPolicy",
    "Policy",
    "PolicyFactory",
    "ScorePolicy",
    "ThompsonPolicy",
    "best_prior",
    "least_measured",
    "make_policy",
    "measured_tps",
    "register_policy",
    "weighted_index",
]
