"""`meshroute serve`: the composition root of a tracker gateway.

Settings are loaded once (defaults < TOML < env < flags), every part of the configuration
that can be wrong is built and checked before anything starts (`GatewayConfig`), and each
component gets exactly the settings it uses: the Router its RouterConfig, the middleware its
own options, the forwarder its timeouts, gossip its GossipConfig, discovery its interfaces,
secret and probe interval.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import multiprocessing
import os
import secrets
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp

from gossip.metrics import metric_families
from gossip.service import GossipConfig, GossipService
from node_agent.discovery import health_checks, tracker_discovery
from node_agent.mdns import parse_interfaces

from ..api import GatewayAPI, build_api_app
from ..core import InvalidNodeError, Router, parse_node
from ..forwarding import AiohttpForwarder, Forwarder
from ..mesh import Mesh, load_nodes_file
from ..middleware import MeshRouteMiddleware, build_router
from ..telemetry import Telemetry
from .settings import ServeSettings, SettingsError, add_arguments, load_settings

log = logging.getLogger("meshroute.serve")
PRUNE_EVERY_S = 60.0

__all__ = ["Gateway", "GatewayConfig", "add_arguments", "background_services", "build_gateway",
           "load_static_nodes", "run", "run_workers", "worker_settings"]


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """One gateway's configuration, built once per process from its settings."""

    settings: ServeSettings
    tracker_id: str
    gossip: GossipConfig | None  # None: this tracker does not gossip

    @classmethod
    def build(cls, settings: ServeSettings) -> GatewayConfig:
        """Check and build what the settings describe; ValueError naming what is wrong."""
        if settings.mdns:
            parse_interfaces(settings.mdns_interfaces)  # refuse a bad value before starting
        gossip = GossipConfig.from_settings(settings) if settings.gossip else None
        tracker_id = settings.tracker_id or f"tracker-{uuid.uuid4().hex[:12]}"
        return cls(settings, tracker_id, gossip)


@dataclass(slots=True)
class Gateway:
    """Everything one tracker gateway is made of; `app` is what uvicorn serves."""

    config: GatewayConfig
    router: Router
    telemetry: Telemetry
    mesh: Mesh
    app: ASGIApp


def build_gateway(config: GatewayConfig | ServeSettings, forwarder: Forwarder | None = None,
                  clock: Callable[[], float] = time.time) -> Gateway:
    """Wire a gateway; nothing starts until the ASGI lifespan runs. `clock` is the routing
    clock (tests pass a fake one)."""
    if isinstance(config, ServeSettings):
        config = GatewayConfig.build(config)
    settings = config.settings
    router = build_router(settings.router, seed=settings.seed, origin=config.tracker_id,
                          clock=clock)
    telemetry = Telemetry(router)
    mesh = Mesh(router, telemetry)
    if settings.nodes_file:
        load_static_nodes(mesh, settings.nodes_file)
    inner: Starlette = build_api_app(GatewayAPI(mesh, settings.node_token))
    inner.router.lifespan_context = lambda app: background_services(config, mesh)
    app = MeshRouteMiddleware(
        inner, settings.middleware(), router=router,
        forwarder=forwarder or AiohttpForwarder(settings.forward_timeouts()),
        telemetry=telemetry)
    return Gateway(config, router, telemetry, mesh, app)


def load_static_nodes(mesh: Mesh, path: str) -> None:
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
async def background_services(config: GatewayConfig, mesh: Mesh) -> AsyncIterator[None]:
    """Background services of a running gateway; each enters the exit stack."""
    settings = config.settings
    # The exit stack is entered inside the task group, so that services with task groups of
    # their own (discovery) are left before it: cancel scopes must exit in LIFO order.
    async with anyio.create_task_group() as tg:
        async with contextlib.AsyncExitStack() as stack:
            tg.start_soon(_prune_loop, mesh.router)
            gossip = None
            if config.gossip is not None:  # statistics exchange with peer trackers
                gossip = GossipService(mesh.router, config.gossip)
                await tg.start(gossip.run)
                mesh.telemetry.add_collector(lambda: metric_families(gossip))
                log.info("gossip: tracker %s on %s, peers %s", config.tracker_id,
                         gossip.address, ", ".join(settings.gossip_peers) or "none yet")
            # discovery: mDNS browsing, health checks, tracker announcement; after gossip,
            # so that the tracker announces its gossip port and feeds it peers.
            if settings.mdns:
                gossip_at = gossip.address if gossip else None
                gossip_port = gossip_at[1] if gossip_at else None
                await stack.enter_async_context(tracker_discovery(
                    mesh, interfaces=settings.mdns_interfaces, mesh_secret=settings.mesh_secret,
                    health_interval_s=settings.health_interval_s,
                    tracker_id=config.tracker_id,
                    announce_http_port=settings.port or gossip_port,
                    announce_gossip_port=gossip_port,
                    announce_host=gossip_at[0] if gossip_at else settings.host,
                    on_tracker=gossip.add_peer if gossip else None,
                    on_tracker_gone=gossip.remove_peer if gossip else None))
                log.info("discovery: browsing mDNS on %s", settings.mdns_interfaces)
            else:  # no mDNS: nodes from POST /v1/nodes or --nodes-file are health-checked alone
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


def run(args: argparse.Namespace) -> int:
    """Build the gateway from flags + env + file and serve it until interrupted."""
    cli = {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "command"}
    try:
        settings = load_settings(cli, os.environ)
        if settings.workers > 1:
            return run_workers(settings)
        gateway = build_gateway(GatewayConfig.build(settings))
    except (SettingsError, ValueError) as exc:
        print(f"meshroute serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(f"meshroute serve: tracker {gateway.config.tracker_id} on "
          f"http://{settings.host}:{settings.port} (policy {settings.router.policy})",
          file=sys.stderr, flush=True)
    uvicorn.run(gateway.app, host=settings.host, port=settings.port,
                log_level=settings.log_level.lower(), lifespan="on", access_log=False)
    return 0


# -- `meshroute serve --workers N` ------------------------------------------------------------

def worker_settings(settings: ServeSettings, index: int, gossip_ports: list[int],
                    tracker_id: str, secret: str) -> ServeSettings:
    """Worker `index`'s settings: its own origin, gossip on loopback port `gossip_ports[index]`
    with every sibling (and any configured peer) as a static peer, under the per-run secret."""
    siblings = tuple(f"127.0.0.1:{p}" for i, p in enumerate(gossip_ports) if i != index)
    return replace(settings, workers=1, tracker_id=f"{tracker_id}-w{index}",
                   gossip_listen=f"127.0.0.1:{gossip_ports[index]}",
                   gossip_peers=siblings + settings.gossip_peers, gossip_secret=secret,
                   gossip_secret_file=None, gossip_fanout=max(settings.gossip_fanout,
                                                              len(gossip_ports) - 1))


def _reuseport_socket(host: str, port: int, listen: bool) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    if listen:
        sock.listen(2048)
        sock.set_inheritable(True)
    return sock


def _free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (held together while chosen, so none repeats)."""
    held = [socket.socket() for _ in range(n)]
    try:
        for sock in held:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in held]
    finally:
        for sock in held:
            sock.close()


def _serve_worker(settings: ServeSettings) -> None:
    """One worker process: its own gateway on its own SO_REUSEPORT socket of the shared port."""
    gateway = build_gateway(GatewayConfig.build(settings))
    sock = _reuseport_socket(settings.host, settings.port, listen=True)
    config = uvicorn.Config(gateway.app, log_level=settings.log_level.lower(), lifespan="on",
                            access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


def run_workers(settings: ServeSettings) -> int:
    """Serve one port with `settings.workers` processes (SO_REUSEPORT: the kernel spreads
    connections over them). Each worker is an origin of its own; they gossip learned
    statistics over loopback ports derived here, authenticated with a secret made for this
    run. Nodes must reach every worker: mDNS or --nodes-file (POST /v1/nodes reaches one)."""
    if settings.gossip_listen:
        print("meshroute serve: --workers gossips on loopback ports of its own; "
              "--gossip-listen cannot be combined with it", file=sys.stderr)
        return 2
    n = settings.workers
    # the parent holds the port (bound, not listening) so that port 0 resolves once
    try:
        holder = _reuseport_socket(settings.host, settings.port, listen=False)
    except OSError as exc:
        print(f"meshroute serve: cannot bind {settings.host}:{settings.port}: {exc}",
              file=sys.stderr)
        return 2
    port = int(holder.getsockname()[1])
    tracker_id = settings.tracker_id or f"tracker-{uuid.uuid4().hex[:12]}"
    secret, gossip_ports = secrets.token_hex(32), _free_ports(n)
    shared = replace(settings, port=port)
    children = []
    try:
        configs = [worker_settings(shared, i, gossip_ports, tracker_id, secret)
                   for i in range(n)]
        for cfg in configs:
            GatewayConfig.build(cfg)  # refuse a bad configuration before any process starts
    except (SettingsError, ValueError) as exc:
        print(f"meshroute serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(f"meshroute serve: {n} workers ({tracker_id}-w0..w{n - 1}) on "
          f"http://{settings.host}:{port} (policy {settings.router.policy}), gossiping on "
          f"127.0.0.1:{','.join(map(str, gossip_ports))}", file=sys.stderr, flush=True)
    context = multiprocessing.get_context("fork")  # no event loop exists yet to inherit
    for cfg in configs:
        child = context.Process(target=_serve_worker, args=(cfg,), daemon=False)
        child.start()
        children.append(child)

    def stop(signum: int, frame: object) -> None:
        for child in children:
            if child.is_alive() and child.pid is not None:
                os.kill(child.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = 0
    try:
        while children:  # one worker gone for good ends the whole server
            ended = [c for c in children if not c.is_alive()]
            if ended:
                code = code or (ended[0].exitcode or 0)
                stop(signal.SIGTERM, None)
                for child in children:
                    child.join(10)
                break
            time.sleep(0.2)
    finally:
        holder.close()
    return 0 if code in (0, -signal.SIGTERM) else 1
