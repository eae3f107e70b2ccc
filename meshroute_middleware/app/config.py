"""GatewayConfig: one tracker gateway's configuration, checked and built once per process,
and what it says about the tracker's exposure."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from gossip.service import GossipConfig
from meshroute_middleware.app.limits import check_limits_store
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.chat.keyring import (
    NodeSecrets,
    Secret,
    resolve_clients,
    resolve_keys,
    resolve_node_keys,
)
from meshroute_middleware.core.clients import Client, ClientConfigError
from meshroute_middleware.core.errors import MeshRouteError
from meshroute_middleware.core.providers.config import ProvidersConfig, unserved_chain_entries
from meshroute_middleware.http.guard import is_loopback_host
from meshroute_middleware.state.store import MEMORY
from node_agent.mdns import parse_interfaces


def new_tracker_id() -> str:
    """A fresh tracker id, for a tracker started without `--tracker-id`."""
    return f"tracker-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """One gateway's configuration, built once per process from its settings."""

    settings: ServeSettings
    tracker_id: str
    gossip: GossipConfig | None  # None: this tracker does not gossip
    # provider keys in `keys` order, resolved at start (issue 12); never printed
    secrets: Mapping[str, tuple[Secret, ...]] = field(default_factory=dict, repr=False)
    # [[clients]] with their keys read and kept only as digests (issue 24)
    clients: tuple[Client, ...] = field(default=(), repr=False)
    # nodes' own API keys ([[node_keys]]): node id -> (the URL it is bound to, the key)
    node_secrets: NodeSecrets = field(default_factory=dict, repr=False)

    def every_secret(self) -> tuple[Secret, ...]:
        """Every key this gateway holds (providers' and nodes'), for the log scrubber."""
        return (*(s for keys in self.secrets.values() for s in keys),
                *(key for _, key in self.node_secrets.values()))

    @classmethod
    def build(cls, settings: ServeSettings,
              environ: Mapping[str, str] | None = None) -> GatewayConfig:
        """Check and build what the settings describe; ValueError naming what is wrong.

        `environ` resolves `env:NAME` provider and client keys (KeyRefError, a ValueError,
        names the reference and never a value). A listener that would let anyone on the
        network spend the provider keys is refused (ClientConfigError) unless
        --anonymous-clients says so."""
        if settings.mdns:
            parse_interfaces(settings.mdns_interfaces)  # refuse a bad value before starting
        gossip = settings.gossip_config()
        tracker_id = settings.tracker_id or new_tracker_id()
        secrets = (resolve_keys(settings.providers, environ or {})
                   if settings.providers is not None else {})
        clients = resolve_clients(settings.clients, environ or {})
        if anonymous_exposure(settings, clients) and not settings.anonymous_clients:
            raise ClientConfigError(
                f"--host {settings.host} serves provider routes with no [[clients]]: anyone "
                "who reaches the port could spend the provider keys; add [[clients]] "
                "(meshroute keys new NAME) or pass --anonymous-clients")
        node_secrets = (resolve_node_keys(settings.providers, environ or {})
                        if settings.providers is not None else {})
        check_chains(settings.providers)  # a chain entry nothing declares: exit 2
        check_limits_store(settings)  # an unreachable --limits-store: exit 2
        return cls(settings, tracker_id, gossip, secrets, clients, node_secrets)


def anonymous_exposure(settings: ServeSettings, clients: tuple[Client, ...]) -> bool:
    """Whether anyone who reaches the listener can spend the provider keys: provider routes,
    no [[clients]], an address that is not loopback."""
    return (settings.providers is not None and not clients
            and not is_loopback_host(settings.host))


def config_warnings(config: GatewayConfig) -> list[str]:
    """What /v1/routing's config warns about: settings that let strangers steer routing."""
    gossip, out = config.gossip, []
    if gossip is not None and gossip.secret is None and config.settings.insecure_gossip:
        out.append("insecure-gossip: gossip frames are not authenticated (--insecure-gossip); "
                   "anyone who reaches the gossip port can feed route statistics")
    if anonymous_exposure(config.settings, config.clients):
        out.append(f"anonymous-clients: chat on {config.settings.host} needs no client key "
                   "(--anonymous-clients, no [[clients]]); anyone who reaches the port can "
                   "spend the provider keys")
    return out


class ChainEntryError(MeshRouteError, ValueError):
    """A chain entry that names no provider model, no profile and no declared mesh model."""


def unserved_chain_entries_of(providers: ProvidersConfig | None) -> list[tuple[str, str]]:
    """(where, entry) for each chain entry naming no provider model, no profile and no
    `[mesh.NAME]` table (issue 33): a typo, or a mesh model not declared."""
    if providers is None:
        return []
    return [(where, entry) for where, entry in unserved_chain_entries(providers)
            if providers.profile(entry) is None]


def check_chains(providers: ProvidersConfig | None) -> None:
    """Refuse the first chain entry nothing declares (ChainEntryError, one line)."""
    for where, entry in unserved_chain_entries_of(providers):
        raise ChainEntryError(
            f"{where} names {entry!r}, which is no provider model, no profile and no "
            f"declared mesh model; declare a mesh model with an (even empty) [mesh.{entry}] "
            "table, or fix the name")


def exposure(config: GatewayConfig) -> str:
    """One line saying what this tracker opens to the network, and how it is guarded."""
    settings, gossip = config.settings, config.gossip
    http = f"http {settings.host}:{settings.port}"
    writes = ("node writes: bearer token (--node-token)" if settings.node_token
              else "node writes: loopback clients only (no --node-token)")
    if not settings.mdns:
        mdns = "mDNS: off"
    elif settings.mesh_secret:
        mdns = f"mDNS: on {settings.mdns_interfaces}, records must be signed (mesh secret)"
    else:
        mdns = (f"mDNS: on {settings.mdns_interfaces}, records UNSIGNED (no --mesh-secret: "
                "new node ids accepted from anyone, known ones kept by their source)")
    if gossip is None:
        talk = "gossip: off"
    else:
        where = (f"{gossip.listen[0]}:{gossip.listen[1]}" if gossip.listen
                 else "outbound only")
        if gossip.secret is not None:
            talk = f"gossip: {where}, authenticated (shared secret)"
        elif settings.insecure_gossip:
            talk = f"gossip: {where}, NOT authenticated (--insecure-gossip)"
        else:
            talk = f"gossip: {where}, not authenticated (loopback only)"
        talk += f", peers {', '.join(settings.gossip_peers) or 'from mDNS'}"
    if config.clients:
        chat = f"chat: client keys required ({len(config.clients)} [[clients]])"
    elif anonymous_exposure(settings, config.clients):
        chat = ("chat: NO client keys (--anonymous-clients): anyone who reaches the port can "
                "spend the provider keys")
    else:
        chat = "chat: no client keys (no [[clients]])"
    return f"open: {http}; {chat}; {writes}; {mdns}; {talk}; max {settings.max_nodes} nodes"


def limits_store_name(settings: ServeSettings) -> str:
    """Where clients' budgets and keys' limits live, for the start line: `memory`, `state
    file PATH` or the Redis URL without its user and password (app/limits.client_store's
    choice)."""
    url = settings.limits_store or ""
    if url.startswith(("redis://", "rediss://")):
        parts = urlsplit(url)
        host = parts.hostname or ""
        where = f"[{host}]" if ":" in host else host
        if parts.port is not None:
            where += f":{parts.port}"
        return urlunsplit((parts.scheme, where, parts.path, "", ""))
    if settings.state_file and settings.state_file != MEMORY:
        return f"state file {settings.state_file}"
    return "memory"


def workers_base_id(saved: str | None) -> str | None:
    """The base tracker id of the workers that last wrote a state file (`<base>-w<i>`: each
    worker writes its own id there), so a restart comes back under the same origins and
    takes its own restored statistics as its own, not as a departed peer's. None when the
    file was written by something else (a single tracker, or nothing yet)."""
    if saved is None:
        return None
    base, sep, index = saved.rpartition("-w")
    return base if sep and base and index.isdigit() else None


def loop_marker(tracker_id: str) -> str:
    """The `via` marker of a tracker (middleware.MiddlewareConfig.loop_marker): the same for
    every worker of one `--workers` run, which share a port and so any loop."""
    base = workers_base_id(tracker_id) or tracker_id
    return hashlib.sha256(base.encode()).hexdigest()[:16]
