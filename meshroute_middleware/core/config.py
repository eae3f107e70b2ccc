"""The routing core's configuration: one frozen dataclass with ADR-0021's defaults."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from . import routes, stats
from .defaults import EXPLORE_SHARE
from .topology import parse_networks


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """Knobs of route selection. Built by meshroute_middleware.app.settings from file/env/CLI."""

    policy: str = "thompson"  # docs/benchmarks.md "Learning quality"; ADR-0021: "adr0021"
    explore_share: float = EXPLORE_SHARE  # ADR-0021 --route-explore-share
    weight_alpha: float = 1.0  # ADR-0021 --route-weight-alpha
    half_life_s: float = stats.HALF_LIFE_S  # ADR-0021 --route-stats-half-life
    min_sample_tokens: int = stats.MIN_SAMPLE_TOKENS
    max_candidates: int = routes.MAX_CANDIDATES
    prune_after_s: float = stats.PRUNE_AFTER_S
    node_networks: tuple[str, ...] = ()  # CIDRs node URLs must point into (empty: anywhere)

    def __post_init__(self) -> None:
        if not 0.0 <= self.explore_share <= 1.0:
            raise ValueError(f"explore_share must be in [0, 1], got {self.explore_share}")
        if self.weight_alpha < 0:
            raise ValueError(f"weight_alpha must be >= 0, got {self.weight_alpha}")
        if self.half_life_s <= 0:
            raise ValueError(f"half_life_s must be > 0, got {self.half_life_s}")
        if self.min_sample_tokens < 0:
            raise ValueError(f"min_sample_tokens must be >= 0, got {self.min_sample_tokens}")
        if self.max_candidates < 1:
            raise ValueError(f"max_candidates must be >= 1, got {self.max_candidates}")
        parse_networks(self.node_networks)

    def to_dict(self) -> dict[str, Any]:
        """The config as shown in /v1/routing."""
        return asdict(self)
