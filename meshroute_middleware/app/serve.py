"""`meshroute serve`: the composition root of a tracker gateway.

Settings are loaded once (defaults < TOML < env < flags), every part of the configuration
that can be wrong is built and checked before anything starts (`GatewayConfig`), and each
component gets exactly the settings it uses: the Router its RouterConfig, the middleware its
own options, the forwarder its timeouts, gossip its GossipConfig, discovery its interfaces,
secret and probe interval.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import multiprocessing
import os
import random
import secrets
import signal
import socket
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace

import anyio
import uvicorn
from starlette.applications import Starlette
from starlette.types import ASGIApp

from gossip.metrics import metric_families
from gossip.service import GossipConfig, GossipService
from meshroute_middleware.api import GatewayAPI, ProviderRoutingAPI, build_api_app
from meshroute_middleware.app.edge import edge_protocol, fit_descriptor_limit
from meshroute_middleware.app.gcpace import GC_FULL_AFTER, GcPacer
from meshroute_middleware.app.settings import (
    DEFAULT_STATE_FILE,
    ServeSettings,
    SettingsError,
    add_arguments,
    load_settings,
)
from meshroute_middleware.chat.keyring import Secret, resolve_keys, scrub
from meshroute_middleware.chat.providers import ProviderChat
from meshroute_middleware.core import InvalidNodeError, Router, parse_node
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.forwarding.client import AiohttpForwarder, Forwarder
from meshroute_middleware.mesh import Mesh, load_nodes_file
from meshroute_middleware.middleware import MeshRouteMiddleware, build_router
from meshroute_middleware.state.keeper import StateKeeper
from meshroute_middleware.state.store import StateStore, StateStoreError
from meshroute_middleware.telemetry.metrics import Telemetry
from node_agent.discovery import health_checks, tracker_discovery
from node_agent.mdns import parse_interfaces

log = logging.getLogger("meshroute.serve")
PRUNE_EVERY_S = 60.0

__all__ = ["Gateway", "GatewayConfig", "add_arguments", "background_services", "build_gateway",
           "config_warnings", "exposure", "load_static_nodes", "run", "run_workers",
           "server_config", "worker_settings"]


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """One gateway's configuration, built once per process from its settings."""

    settings: ServeSettings
    tracker_id: str
    gossip: GossipConfig | None  # None: this tracker does not gossip
    # provider keys in `keys` order, resolved at start (issue 12); never printed
    secrets: Mapping[str, tuple[Secret, ...]] = field(default_factory=dict, repr=False)

    @classmethod
    def build(cls, settings: ServeSettings,
              environ: Mapping[str, str] | None = None) -> GatewayConfig:
        """Check and build what the settings describe; ValueError naming what is wrong.

        `environ` resolves `env:NAME` provider keys (KeyRefError, a ValueError, names the
        reference and never a value)."""
        if settings.mdns:
            parse_interfaces(settings.mdns_interfaces)  # refuse a bad value before starting
        gossip = GossipConfig.from_settings(settings) if settings.gossip else None
        tracker_id = settings.tracker_id or f"tracker-{uuid.uuid4().hex[:12]}"
        secrets = (resolve_keys(settings.providers, environ or {})
                   if settings.providers is not None else {})
        return cls(settings, tracker_id, gossip, secrets)


@dataclass(slots=True)
class Gateway:
    """Everything one tracker gateway is made of; `app` is what uvicorn serves."""

    config: GatewayConfig
    router: Router
    telemetry: Telemetry
    mesh: Mesh
    app: ASGIApp
    providers: ProviderRouter | None = None  # provider routes, when the config has them
    store: StateStore | None = None  # the state file, open while the gateway lives
    keeper: StateKeeper | None = None  # what restores and saves it


def build_gateway(config: GatewayConfig | ServeSettings, forwarder: Forwarder | None = None,
                  clock: Callable[[], float] = time.time) -> Gateway:
    """Wire a gateway; nothing starts until the ASGI lifespan runs. `clock` is the routing
    clock (tests pass a fake one)."""
    if isinstance(config, ServeSettings):
        config = GatewayConfig.build(config)
    store = open_state_file(config.settings)
    try:
        return _build_gateway(config, store, forwarder, clock)
    except BaseException:
        if store is not None:
            store.close()
        raise


def open_state_file(settings: ServeSettings) -> StateStore | None:
    """The state file `--state-file` names (with provider tables, the default one), open and
    checked writable; None when there is none. StateStoreError says why it cannot be used."""
    path = settings.state_file
    if path is None and settings.providers is not None:
        path = DEFAULT_STATE_FILE
    return None if path is None else StateStore(path).open()


def _build_gateway(config: GatewayConfig, store: StateStore | None,
                   forwarder: Forwarder | None, clock: Callable[[], float]) -> Gateway:
    settings = config.settings
    if store is not None and settings.tracker_id is None:  # the same origin as before
        config = replace(config, tracker_id=store.meta("tracker_id") or config.tracker_id)
    router = build_router(settings.router, seed=settings.seed, origin=config.tracker_id,
                          clock=clock)
    telemetry = Telemetry(router)
    mesh = Mesh(router, telemetry, settings.max_nodes)
    if settings.nodes_file:
        load_static_nodes(mesh, settings.nodes_file)
    forwarder = forwarder or AiohttpForwarder(settings.forward_timeouts())
    if isinstance(forwarder, AiohttpForwarder):
        telemetry.add_collector(forwarder.metric_families)
    providers = chat = keeper = None
    extra = []
    if settings.providers is not None:
        providers = ProviderRouter(settings.providers)
    if store is not None:
        keeper = StateKeeper(store, router, providers)
        keeper.restore(clock())
        telemetry.add_collector(keeper.metric_families)
    if providers is not None:
        chat = ProviderChat(providers, config.secrets, forwarder, router, telemetry,
                            timeouts=settings.forward_timeouts(),
                            request_timeout_s=settings.request_timeout_s, clock=clock,
                            rng=random.Random(settings.seed))
        extra = ProviderRoutingAPI(providers, router, clock=clock,
                                   admin_token=settings.admin_token or settings.node_token
                                   ).routes()
    inner: Starlette = build_api_app(GatewayAPI(mesh, settings.node_token,
                                                warnings=config_warnings(config),
                                                providers=providers), extra)
    inner.router.lifespan_context = lambda app: background_services(config, mesh, keeper, clock)
    app = MeshRouteMiddleware(inner, settings.middleware(), router=router, forwarder=forwarder,
                              telemetry=telemetry, providers=chat)
    return Gateway(config, router, telemetry, mesh, app, providers, store, keeper)


def load_static_nodes(mesh: Mesh, path: str) -> None:
    """Validate every record of a nodes file first; refuse the file whole if one is bad."""
    records = []
    for i, data in enumerate(load_nodes_file(path)):
        try:
            records.append(parse_node(data, now=mesh.router.clock(),
                                      networks=mesh.router.topology.networks))
        except InvalidNodeError as exc:
            raise ValueError(f"{path}: node #{i}: {exc}") from exc
    if len({r.node_id for r in records}) > mesh.max_nodes:
        raise ValueError(f"{path}: more than --max-nodes {mesh.max_nodes} nodes")
    for record in records:
        mesh.upsert(record)


def config_warnings(config: GatewayConfig) -> list[str]:
    """What /v1/routing's config warns about: settings that let strangers steer routing."""
    gossip = config.gossip
    if gossip is not None and gossip.secret is None and config.settings.insecure_gossip:
        return ["insecure-gossip: gossip frames are not authenticated (--insecure-gossip); "
                "anyone who reaches the gossip port can feed route statistics"]
    return []


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
    return f"open: {http}; {writes}; {mdns}; {talk}; max {settings.max_nodes} nodes"


@contextlib.asynccontextmanager
async def background_services(config: GatewayConfig, mesh: Mesh,
                              keeper: StateKeeper | None = None,
                              clock: Callable[[], float] = time.time) -> AsyncIterator[None]:
    """Background services of a running gateway; each enters the exit stack."""
    settings = config.settings
    log.log(logging.WARNING if config_warnings(config) else logging.INFO, "%s",
            exposure(config))
    # The exit stack is entered inside the task group, so that services with task groups of
    # their own (discovery) are left before it: cancel scopes must exit in LIFO order.
    async with anyio.create_task_group() as tg:
        async with contextlib.AsyncExitStack() as stack:
            tg.start_soon(_prune_loop, mesh.router)
            if keeper is not None:  # the state file: saved while serving, and at shutdown
                tg.start_soon(keeper.run, clock)
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


class _ScrubKeys(logging.Filter):
    """A last line of defence: no provider key in a log line, whatever logged it."""

    def __init__(self, secrets: tuple[Secret, ...]) -> None:
        super().__init__()
        self.secrets = secrets

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = scrub(message, self.secrets)
        if clean != message:
            record.msg, record.args = clean, ()
        return True


def run(args: argparse.Namespace) -> int:
    """Build the gateway from flags + env + file and serve it until interrupted."""
    cli = {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "command"}
    try:
        settings = load_settings(cli, os.environ)
        if settings.workers > 1:
            return run_workers(settings)
        gateway = build_gateway(GatewayConfig.build(settings, os.environ))
    except (SettingsError, ValueError, StateStoreError) as exc:
        print(f"meshroute serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    secrets = tuple(s for keys in gateway.config.secrets.values() for s in keys)
    if secrets:
        for handler in logging.getLogger().handlers:
            handler.addFilter(_ScrubKeys(secrets))
    if gateway.providers is not None:
        cfg = gateway.providers.cfg
        print(f"meshroute serve: {len(cfg.providers)} provider(s), "
              f"{sum(len(p.keys) for p in cfg.providers)} key(s)", file=sys.stderr, flush=True)
    if gateway.keeper is not None:
        print(f"meshroute serve: state in {gateway.keeper.store.path} "
              f"({gateway.keeper.restored} route statistics restored)", file=sys.stderr,
              flush=True)
    print(f"meshroute serve: tracker {gateway.config.tracker_id} on "
          f"http://{settings.host}:{settings.port} (policy {settings.router.policy})",
          file=sys.stderr, flush=True)
    fit_descriptor_limit(settings.max_connections)
    _serve(gateway, server_config(gateway))
    return 0


def settle_heap() -> None:
    """The garbage collector's set-up for `--gc python` (docs/benchmarks.md, "Load and soak").

    - The start-up heap is frozen: imports and the gateway as built (~55 thousand objects)
      leave every later collection, whose full ones otherwise walk them each time.
    - Full collections are made ~10x rarer (GC_FULL_AFTER): each walks every live tracked
      object, ~116 per open stream, at ~1 µs each: ~100 ms of one core with 1,000 streams
      open, a stall of the event loop that no setting shortens. Under load they found
      nothing to free (the chat path makes no reference cycles, tests/test_middleware_cycles.py),
      and the young collections, which free short-lived cycles, are left as they are.
    The default, `--gc paced`, goes further: app/gcpace.py.
    """
    gc.collect()
    gc.freeze()
    young, middle, _ = gc.get_threshold()
    gc.set_threshold(young, middle, GC_FULL_AFTER)


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvicorn's own choice (loop "auto"): uvloop where it is installed."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def _serve(gateway: Gateway, config: uvicorn.Config,
           sockets: list[socket.socket] | None = None) -> None:
    """Run uvicorn with the garbage collector paced on its loop (app/gcpace.py), or with
    CPython's own on a settled heap (`--gc python`)."""
    config.load()  # uvicorn's protocol and app wrappers are built now, so frozen too
    server = uvicorn.Server(config)
    if gateway.config.settings.gc == "python":
        settle_heap()
        server.run(sockets=sockets)
        return
    pacer = GcPacer()
    gateway.telemetry.add_collector(pacer.metric_families)
    pacer.settle()

    async def serve() -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(pacer.run)
            try:
                await server.serve(sockets=sockets)
            finally:
                tg.cancel_scope.cancel()

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(serve())


def server_config(gateway: Gateway, port: int | None = None) -> uvicorn.Config:
    """uvicorn's configuration for a gateway: its address and the HTTP edge's limits
    (app.edge: head size, header lines, head timeout, connections; uvicorn's own
    `limit_concurrency` is left off, ours refuses a connection at once)."""
    settings = gateway.config.settings
    return uvicorn.Config(
        gateway.app, host=settings.host, port=settings.port if port is None else port,
        log_level=settings.log_level.lower(), lifespan="on", access_log=False,
        http=edge_protocol(settings.edge_limits(), gateway.telemetry.reject))


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


def workers_base_id(saved: str | None) -> str | None:
    """The base tracker id of the workers that last wrote a state file (`<base>-w<i>`: each
    worker writes its own id there), so a restart comes back under the same origins and
    takes its own restored statistics as its own, not as a departed peer's. None when the
    file was written by something else (a single tracker, or nothing yet)."""
    if saved is None:
        return None
    base, sep, index = saved.rpartition("-w")
    return base if sep and base and index.isdigit() else None


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
    gateway = build_gateway(GatewayConfig.build(settings, os.environ))
    sock = _reuseport_socket(settings.host, settings.port, listen=True)
    _serve(gateway, server_config(gateway), sockets=[sock])


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
        store = open_state_file(shared)  # refuse an unusable state file (the workers share it)
        if store is not None:
            if settings.tracker_id is None:  # the same origins as the last run's workers
                tracker_id = workers_base_id(store.meta("tracker_id")) or tracker_id
            store.close()
        configs = [worker_settings(shared, i, gossip_ports, tracker_id, secret)
                   for i in range(n)]
        for cfg in configs:
            GatewayConfig.build(cfg, os.environ)  # and a bad one before any process starts
    except (SettingsError, ValueError, StateStoreError) as exc:
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
