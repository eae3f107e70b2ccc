"""Who may spend (issue 24): a client of the gateway, as `[[clients]]` configures it.

Pure data: the key itself is never kept, only its SHA-256 digest (`key_digest`)."""

from __future__ import annotations

from dataclasses import dataclass

# Where an authenticated request carries its client: scope["state"][CLIENT_STATE].
CLIENT_STATE = "meshroute.client"


@dataclass(frozen=True, slots=True)
class Client:
    """One client: its name (what logs, metrics and usage show), the digest of its key, the
    models it may use (glob patterns; empty: everything), and its limits and budgets (None:
    unlimited)."""

    name: str
    key_digest: bytes
    models: tuple[str, ...] = ()
    rpm: int | None = None
    tpm: int | None = None
    daily_tokens: int | None = None
    monthly_usd: float | None = None
