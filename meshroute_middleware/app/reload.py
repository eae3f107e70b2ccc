"""Reload (SIGHUP): the config file read again and what it says of clients, chains, providers,
key limits, aliases and mesh models' limits put in place, without dropping a request (issue 33).

What a reload changes is built beside what serves now, then put in place at once (the event
loop runs one thing at a time): a request in flight keeps what it started with, the next one
gets the new. What the process learned stays: route statistics, key cooldowns and usage,
nodes, sessions. Listening, gossip, discovery and the state file are the process's own and
are not reloaded (a restart changes them). A config with an error changes nothing: one line
says why, and the old one keeps serving.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from typing import Any, cast

from prometheus_client.core import Metric

from meshroute_middleware.app.config import GatewayConfig
from meshroute_middleware.app.gateway import Gateway, front, provider_chat
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.chat.spend import caps_of, prices_of
from meshroute_middleware.core.errors import MeshRouteError
from meshroute_middleware.state.store import StateStoreError
from meshroute_middleware.telemetry.metrics import Telemetry
from node_agent.serving import one_line

log = logging.getLogger("meshroute.serve")


class ReloadError(MeshRouteError):
    """A reload this process cannot apply (it needs a restart)."""


class Reloader:
    """Reads the settings again (`reread`: file + env + flags, as at start) and applies them
    to `gateway`; `reload()` is what SIGHUP runs."""

    def __init__(self, gateway: Gateway, reread: Callable[[], ServeSettings],
                 environ: Mapping[str, str]) -> None:
        self.gateway, self.reread, self.environ = gateway, reread, environ
        self._running: asyncio.Task[None] | None = None
        self._again = False  # a signal came during the reload running now

    def soon(self) -> None:
        """Start a reload on the running loop, one at a time: signals during one are folded
        into one more after it (the file may have changed after it was read)."""
        if self._running is None or self._running.done():
            self._running = asyncio.get_running_loop().create_task(self._reloads())
        else:
            self._again = True

    async def _reloads(self) -> None:
        """Reload, and again while a signal came during the last one."""
        again = True
        while again:
            self._again = False
            await self.reload()
            again = self._again

    async def reload(self) -> bool:
        """Read and apply the config; False (and one log line) when it has an error."""
        try:
            config = await asyncio.to_thread(self._checked)  # file, env, a Redis check
            apply(self.gateway, config)
        except (ValueError, StateStoreError, ReloadError) as exc:
            log.error("reload refused, the running config kept: %s", one_line(exc))
            return False
        log.info("reloaded: %s", summary(config))
        return True

    def _checked(self) -> GatewayConfig:
        fresh, running = self.reread(), self.gateway.config
        settings = replace(running.settings, providers=fresh.providers, clients=fresh.clients)
        return replace(GatewayConfig.build(settings, self.environ),
                       tracker_id=running.tracker_id, gossip=running.gossip)


def apply(gateway: Gateway, config: GatewayConfig) -> None:
    """Put `config`'s clients, chains, providers, limits and aliases in place (ReloadError
    when it adds or removes the provider tables: a restart does that)."""
    providers, cfg = gateway.providers, config.settings.providers
    if (providers is None) != (cfg is None):
        raise ReloadError("adding or removing the provider tables needs a restart")
    guard = gateway.guard
    if guard is None:
        raise ReloadError("this gateway's app cannot be reloaded")
    gateway.config = config
    if providers is not None and cfg is not None:
        old = gateway.chat
        providers.cfg = cfg  # the same router: its statistics, gates and sessions stay
        gateway.chat = provider_chat(gateway, config, cast(Telemetry, _Quiet(gateway.telemetry)))
        if old is not None and gateway.chat is not None:  # embeddings' statistics too
            gateway.chat.embeddings_providers.stats = old.embeddings_providers.stats
            gateway.chat.embeddings_providers.peers = old.embeddings_providers.peers
    if gateway.spend is not None:
        gateway.spend.prices = dict(prices_of(cfg))
        gateway.spend.caps = dict(caps_of(cfg))
    guard.app = front(gateway)


def summary(config: GatewayConfig) -> str:
    """What a reload put in place, in one line."""
    cfg = config.settings.providers
    if cfg is None:
        return f"{len(config.clients)} client(s), no provider routes"
    return (f"{len(config.clients)} client(s), {len(cfg.providers)} provider(s), "
            f"{sum(len(p.keys) for p in cfg.providers)} key(s), "
            f"{1 + len(cfg.profiles)} chain(s), {len(cfg.mesh_limits)} mesh model(s)")


class _Quiet:
    """The gateway's Telemetry for a provider chain built again: its metrics are exported by
    the first one's collectors (which read the same ProviderRouter), so none is added."""

    def __init__(self, telemetry: Telemetry) -> None:
        object.__setattr__(self, "_telemetry", telemetry)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._telemetry, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._telemetry, name, value)

    def add_collector(self, produce: Callable[[], Iterable[Metric]]) -> None:
        """Kept by the first chain's collector."""
