"""The background services of a running gateway (its ASGI lifespan): route pruning, the
state saver, gossip, and discovery (mDNS browsing and health checks) or health checks alone."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable

import anyio

from gossip.metrics import metric_families
from gossip.service import GossipService
from meshroute_middleware.app.config import GatewayConfig, config_warnings, exposure
from meshroute_middleware.app.nodeshare import NodeLog, follow
from meshroute_middleware.app.supervise import Supervisor, until_cancelled
from meshroute_middleware.core import Router
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.mesh import Mesh
from meshroute_middleware.state.keeper import StateKeeper
from meshroute_middleware.state.shared_gates import SharedGates
from node_agent.discovery import health_checks, tracker_discovery

log = logging.getLogger("meshroute.serve")
PRUNE_EVERY_S = 60.0


@contextlib.asynccontextmanager
async def background_services(config: GatewayConfig, mesh: Mesh,
                              keeper: StateKeeper | None = None,
                              clock: Callable[[], float] = time.time,
                              providers: ProviderRouter | None = None,
                              embeddings_router: Router | None = None,
                              node_log: NodeLog | None = None) -> AsyncIterator[None]:
    """Background services of a running gateway, each supervised."""
    settings = config.settings
    log.log(logging.WARNING if config_warnings(config) else logging.INFO, "%s",
            exposure(config))
    # Each service runs supervised (app/supervise.py): a failure is logged, counted, shown
    # degraded on /healthz and restarted; it never ends the others.
    supervisor = Supervisor(mesh.telemetry.services)
    async with anyio.create_task_group() as tg:
        pruned = (mesh.router,) if embeddings_router is None else (mesh.router,
                                                                    embeddings_router)
        tg.start_soon(supervisor.run, "pruning", lambda: _prune_loop(*pruned))
        if providers is not None and isinstance(providers.gates, SharedGates):
            tg.start_soon(supervisor.run, "limits-heartbeat", providers.gates.heartbeats)
        if node_log is not None:  # --workers: the siblings' HTTP node writes, applied here
            tg.start_soon(supervisor.run, "node-writes", lambda: follow(mesh, node_log))
        if keeper is not None:  # the state file: saved while serving, and at shutdown
            tg.start_soon(supervisor.run, "state", lambda: keeper.run(clock))
        gossip = None
        if config.gossip is not None:  # statistics exchange with peer trackers
            gossip = GossipService(mesh.router, config.gossip, providers=providers)
            await tg.start(supervisor.run_started, "gossip", gossip.run)
            mesh.telemetry.add_collector(lambda: metric_families(gossip))
            log.info("gossip: tracker %s on %s, peers %s", config.tracker_id,
                     gossip.address, ", ".join(settings.gossip_peers) or "none yet")
        # discovery: mDNS browsing, health checks, tracker announcement; after gossip,
        # so that the tracker announces its gossip port and feeds it peers.
        if settings.mdns:
            gossip_at = gossip.address if gossip else None
            gossip_port = gossip_at[1] if gossip_at else None
            tg.start_soon(supervisor.run, "discovery", until_cancelled(lambda: tracker_discovery(
                mesh, interfaces=settings.mdns_interfaces, mesh_secret=settings.mesh_secret,
                health_interval_s=settings.health_interval_s,
                tracker_id=config.tracker_id,
                announce_http_port=settings.port or gossip_port,
                announce_gossip_port=gossip_port,
                announce_host=gossip_at[0] if gossip_at else settings.host,
                on_tracker=gossip.add_peer if gossip else None,
                on_tracker_gone=gossip.remove_peer if gossip else None)))
            log.info("discovery: browsing mDNS on %s", settings.mdns_interfaces)
        else:  # no mDNS: nodes from POST /v1/nodes or --nodes-file are health-checked alone
            tg.start_soon(supervisor.run, "health-checks", until_cancelled(lambda: health_checks(
                mesh, health_interval_s=settings.health_interval_s)))
        yield
        tg.cancel_scope.cancel()


async def _prune_loop(*routers: Router) -> None:
    while True:
        await anyio.sleep(PRUNE_EVERY_S)
        dropped = sum(router.prune() for router in routers)
        if dropped:
            log.info("pruned %d route statistics unseen for 24 h", dropped)
