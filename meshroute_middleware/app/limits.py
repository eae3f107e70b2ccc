"""Where a gateway's provider key gates live (`--limits-store`): its own memory, the state file
its `--workers` share, or Redis (state/limits.py, state/redis_limits.py)."""

from __future__ import annotations

import time
from collections.abc import Callable

from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core.providers.peers import Peers
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.state.fallback import FallbackLimits
from meshroute_middleware.state.limits import LimitsStore, LimitsStoreError
from meshroute_middleware.state.live_clients import LiveClients
from meshroute_middleware.state.redis_limits import RedisLimits
from meshroute_middleware.state.shared_gates import SharedGates
from meshroute_middleware.state.sqlite_limits import SqliteLimits
from meshroute_middleware.state.store import MEMORY


def limits_mode(settings: ServeSettings) -> str:
    """"local", "state-file" or the redis:// URL (the default: local; --workers: state-file)."""
    if settings.providers is None:
        return "local"
    return settings.limits_store or ("state-file" if settings.workers > 1 else "local")


def check_limits_store(settings: ServeSettings) -> None:
    """Before anything starts: a store that cannot be used is a one-line LimitsStoreError."""
    mode = limits_mode(settings)
    if mode == "state-file" and (settings.state_file or MEMORY) == MEMORY:
        raise LimitsStoreError("provider limits are shared through the state file, and "
                               "--state-file ':memory:' cannot be shared: name a file or "
                               "--limits-store redis://HOST:PORT/DB")
    if mode.startswith(("redis://", "rediss://")):
        RedisLimits.check(mode)


def shared_gates(settings: ServeSettings, tracker: str,
                 clock: Callable[[], float] = time.time) -> SharedGates | None:
    """The gateway's shared key gates; None for gates of its own (`KeyGates`)."""
    mode = limits_mode(settings)
    if settings.providers is None or mode == "local":
        return None
    if mode == "state-file":
        store: SqliteLimits | RedisLimits = SqliteLimits(
            settings.state_file or MEMORY).open()
    else:
        store = RedisLimits(mode)
    return SharedGates(settings.providers, store, tracker, clock)


def gossip_providers(providers: ProviderRouter) -> None:
    """Take peers' provider reports in: their statistics always; their cooldowns, revocations
    and usage only where the gates are this process's own (a shared store counts those)."""
    providers.peers = Peers()
    if not isinstance(providers.gates, SharedGates):
        providers.gates.peers = providers.peers
        providers.gates.mode = "gossip"


def client_store(settings: ServeSettings) -> LimitsStore:
    """Where clients' limits, budgets and usage ledger live (issue 24): Redis with
    `--limits-store redis://…`, else the state file (shared by the `--workers`, kept across
    restarts), else this process's memory (`--state-file :memory:`: live gates,
    state/live_clients.py). A shared store is
    wrapped so that an outage decides on the rows last read and writes back (issue 32)."""
    url = settings.limits_store or ""
    if url.startswith(("redis://", "rediss://")):
        return FallbackLimits(RedisLimits(url, retention_days=settings.usage_retention_days))
    if settings.state_file and settings.state_file != MEMORY:
        return FallbackLimits(SqliteLimits(settings.state_file).open())
    return LiveClients()
