"""The composition root of `meshroute serve`: router, middleware, forwarding, discovery, gossip."""

from __future__ import annotations

import contextlib
import logging
import random
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

import anyio
from starlette.applications import Starlette
from starlette.types import ASGIApp

from .api import GatewayAPI, build_api_app
from .core import InvalidNodeError, Router, parse_node
from .forwarding import AiohttpForwarder, Forwarder
from .mesh import Mesh, load_nodes_file
from .middleware import MeshRouteMiddleware, MiddlewareConfig
from .settings import ServeSettings
from .telemetry import Telemetry

log = logging.getLogger("meshroute.serve")
PRUNE_EVERY_S = 60.0


@dataclass(slots=True)
class Gateway:
    """Everything one tracker gateway is made of; `app` is what uvicorn serves."""

    settings: ServeSettings
    router: Router
    telemetry: Telemetry
    mesh: Mesh
    app: ASGIApp
    tracker_id: str


def build_gateway(settings: ServeSettings, forwarder: Forwarder | None = None) -> Gateway:
    """Wire a gateway from settings; nothing starts until the ASGI lifespan runs."""
    tracker_id = settings.tracker_id or f"tracker-{uuid.uuid4().hex[:12]}"
    router = Router(settings.router, clock=time.time, rng=random.Random(settings.seed),
                    origin=tracker_id)
    telemetry = Telemetry(router)
    mesh = Mesh(router, telemetry)
    if settings.nodes_file:
        _load_static_nodes(mesh, settings.nodes_file)
    inner: Starlette = build_api_app(GatewayAPI(mesh, settings.node_token))
    inner.router.lifespan_context = lambda app: _lifespan(settings, mesh, tracker_id)
    config = MiddlewareConfig(
        mode="forward", max_body_bytes=settings.max_body_bytes,
        connect_timeout_s=settings.connect_timeout_s,
        first_byte_timeout_s=settings.first_byte_timeout_s, router=settings.router)
    forwarder = forwarder or AiohttpForwarder(settings.connect_timeout_s,
                                              settings.first_byte_timeout_s)
    app = MeshRouteMiddleware(inner, config, router=router, forwarder=forwarder,
                              telemetry=telemetry)
    return Gateway(settings, router, telemetry, mesh, app, tracker_id)


def _load_static_nodes(mesh: Mesh, path: str) -> None:
    """Validate every record of a nodes file first; refuse the file whole if one is bad."""
    records = []
    for i, data in enumerate(load_nodes_file(path)):
        try:
            records.append(parse_node(data, now=mesh.router.clock()))
        except InvalidNodeError as exc:
            raise ValueError(f"{path}: node #{i}: {exc}") from exc
    for record in records:
        mesh.upsert(record)


@contextlib.asynccontextmanager
async def _lifespan(settings: ServeSettings, mesh: Mesh, tracker_id: str
                    ) -> AsyncIterator[None]:
    """Background services of a running gateway; each enters the exit stack."""
    # The exit stack is entered inside the task group, so that services with task groups of
    # their own (discovery) are left before it: cancel scopes must exit in LIFO order.
    async with anyio.create_task_group() as tg:
        async with contextlib.AsyncExitStack() as stack:
            tg.start_soon(_prune_loop, mesh.router)
            gossip = None
            # gossip: (gossip) statistics exchange with peer trackers
            if settings.gossip_listen or settings.gossip_peers:
                from gossip.metrics import metric_families
                from gossip.service import GossipConfig, GossipService

                gossip = GossipService(mesh.router, GossipConfig.from_settings(settings))
                await tg.start(gossip.run)
                mesh.telemetry.add_collector(lambda: metric_families(gossip))
                log.info("gossip: tracker %s on %s, peers %s", tracker_id, gossip.address,
                         ", ".join(settings.gossip_peers) or "none yet")
            # discovery: (node_agent) mDNS browsing, health checks, tracker announcement;
            # after gossip, so that the tracker announces its gossip port and feeds it peers.
            if settings.mdns:
                from node_agent.discovery import tracker_discovery

                gossip_at = gossip.address if gossip else None
                gossip_port = gossip_at[1] if gossip_at else None
                await stack.enter_async_context(tracker_discovery(
                    mesh, interfaces=settings.mdns_interfaces, mesh_secret=settings.mesh_secret,
                    health_interval_s=settings.health_interval_s, tracker_id=tracker_id,
                    announce_http_port=settings.port or gossip_port,
                    announce_gossip_port=gossip_port,
                    announce_host=gossip_at[0] if gossip_at else settings.host,
                    on_tracker=gossip.add_peer if gossip else None,
                    on_tracker_gone=gossip.remove_peer if gossip else None))
                log.info("discovery: browsing mDNS on %s", settings.mdns_interfaces)
            else:  # no mDNS: nodes from POST /v1/nodes or --nodes-file are health-checked alone
                from node_agent.discovery import health_checks

                await stack.enter_async_context(
                    health_checks(mesh, health_interval_s=settings.health_interval_s))
            yield
        tg.cancel_scope.cancel()


async def _prune_loop(router: Router) -> None:
    while True:
        await anyio.sleep(PRUNE_EVERY_S)
        dropped = router.prune()
        if dropped:
            log.info("pruned %d route statistics unseen for 24 h", dropped)
