"""Provider routes (issue 12): config, scoring, key gates, chains, exhaustion. Pure, no I/O."""

from .chain import Candidate, InvalidModelError, Resolution, Sessions, resolve
from .config import (
    Limits,
    Profile,
    Provider,
    ProviderConfigError,
    ProviderModel,
    ProvidersConfig,
    Routing,
    parse_providers_config,
)
from .exhaustion import (
    Exhaustion,
    PassedOver,
    attempt_reason,
    soonest_reset,
)
from .keys import (
    KeyGates,
    Refusal,
    Reservation,
    parse_retry_after,
)
from .ranked import Scored
from .router import (
    ChainAttempt,
    ProviderRouter,
    StateRestoreError,
)
from .scoring import (
    OutcomeKind,
    RouteStats,
    Weights,
    classify_status,
)
from .tokens import TokenEstimate, estimate

__all__ = [
    "Candidate",
    "ChainAttempt",
    "Exhaustion",
    "InvalidModelError",
    "KeyGates",
    "Limits",
    "OutcomeKind",
    "PassedOver",
    "Profile",
    "Provider",
    "ProviderConfigError",
    "ProviderModel",
    "ProviderRouter",
    "ProvidersConfig",
    "Refusal",
    "Reservation",
    "Resolution",
    "RouteStats",
    "Routing",
    "Scored",
    "Sessions",
    "StateRestoreError",
    "TokenEstimate",
    "Weights",
    "attempt_reason",
    "classify_status",
    "estimate",
    "parse_providers_config",
    "parse_retry_after",
    "resolve",
    "soonest_reset",
]
