"""Pins the provider core's public surface (what the integration step imports)."""

from __future__ import annotations

import meshroute_middleware.core.providers as providers

EXPORTS = {
    "ChainAttempt", "Candidate", "Exhaustion", "InvalidModelError", "KeyGates", "Limits",
    "OutcomeKind", "PassedOver", "Profile", "Provider", "ProviderConfigError", "ProviderModel",
    "ProviderRouter", "ProvidersConfig", "Refusal", "Reservation", "Resolution", "RouteStats",
    "Routing", "Scored", "Sessions", "StateRestoreError", "TokenEstimate", "Weights",
    "attempt_reason", "classify_status", "estimate", "parse_providers_config",
    "parse_retry_after", "resolve", "soonest_reset",
}


def test_provider_core_exports() -> None:
    assert set(providers.__all__) == EXPORTS
    assert len(providers.__all__) == len(EXPORTS)
    for name in providers.__all__:
        assert getattr(providers, name).__module__.startswith(
            "meshroute_middleware.core.providers"), name
