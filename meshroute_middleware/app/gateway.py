"""Wiring a tracker gateway: each component gets exactly the settings it uses (the Router its
RouterConfig, the middleware its own options, the forwarder its timeouts, the provider chain
its keys, the state file its keeper); nothing starts until the ASGI lifespan runs."""

from __future__ import annotations

import contextlib
import functools
import os
import random
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field, replace
from pathlib import Path

from starlette.applications import Starlette
from starlette.types import ASGIApp, Receive, Scope, Send

from meshroute_middleware.api import GatewayAPI, ProviderRoutingAPI, UsageAPI, build_api_app
from meshroute_middleware.app.access import AccessCounters, AccessLog, ClientEvents
from meshroute_middleware.app.config import (
    GatewayConfig,
    config_warnings,
    loop_marker,
)
from meshroute_middleware.app.drain import ROUTED_PATHS
from meshroute_middleware.app.firstpaint import FirstPaint
from meshroute_middleware.app.limits import client_store, gossip_providers, shared_gates
from meshroute_middleware.app.nodeshare import NodeLog, ShareNodeWrites
from meshroute_middleware.app.services import background_services
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.chat.dialects import DIALECTS
from meshroute_middleware.chat.hedge import Hedging, client_reserve
from meshroute_middleware.chat.providers import ProviderChat
from meshroute_middleware.chat.spend import ClientSpend, caps_of, prices_of
from meshroute_middleware.core import InvalidNodeError, Router, parse_node
from meshroute_middleware.core.aliases import NO_ALIASES
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.forwarding.client import AiohttpForwarder, Forwarder
from meshroute_middleware.http.guard import RequestGuard
from meshroute_middleware.mesh import Listening, Mesh, load_nodes_file
from meshroute_middleware.middleware import (
    MeshRouteMiddleware,
    build_embeddings_router,
    build_router,
)
from meshroute_middleware.state.keeper import StateKeeper
from meshroute_middleware.state.shared_gates import SharedGates
from meshroute_middleware.state.store import MEMORY, StateStore, StateStoreError
from meshroute_middleware.telemetry.metrics import Telemetry

Lifespan = Callable[[Starlette], AbstractAsyncContextManager[None]]
PRIVATE_DIR = 0o700  # a state directory the gateway creates: its owner's alone
PRIVATE_FILE = 0o600  # a state file the gateway creates (node URLs, statistics, usage)


async def _no_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise RuntimeError("a gateway being built serves nothing")
_NO_APP: ASGIApp = _no_app


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
    spend: ClientSpend | None = None  # clients' limits, budgets and usage ledger (issue 24)
    # why the background services could not start, once the lifespan tried (app/run.py)
    startup_failures: list[BaseException] = field(default_factory=list)
    # embeddings' own statistics over `router`'s topology (middleware.build_embeddings_router)
    embeddings_router: Router | None = None
    forwarder: Forwarder | None = None
    gates: SharedGates | None = None  # provider key limits shared with other trackers
    clock: Callable[[], float] = time.time
    chat: ProviderChat | None = None  # the provider chain's server
    guard: RequestGuard | None = None  # over what a reload builds again (app/reload.py)
    hedging: Hedging | None = None  # hedged first tokens (chat/hedge.py): kept over reloads


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
    """The state file `--state-file` names (load_settings puts the default one there when
    the file has provider tables), open and checked writable; None when there is none.
    StateStoreError says why it cannot be used."""
    path = settings.state_file
    if path is None:
        return None
    if path != MEMORY:
        create_private(Path(path))
    return StateStore(path).open()


def create_private(path: Path) -> None:
    """Create a missing state file 0600, and its missing directories 0700; an existing file
    or directory is left as it is. StateStoreError names the file."""
    try:
        missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
        for directory in reversed(missing):
            directory.mkdir(mode=PRIVATE_DIR)
            os.chmod(directory, PRIVATE_DIR)  # whatever the umask
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE)
    except FileExistsError:
        return
    except OSError as exc:
        raise StateStoreError(f"cannot open state file {path}: "
                              f"{(exc.strerror or str(exc)).lower()}") from exc
    try:
        os.fchmod(fd, PRIVATE_FILE)  # SQLite gives its -wal and -shm files the same mode
    finally:
        os.close(fd)


def _build_gateway(config: GatewayConfig, store: StateStore | None,
                   forwarder: Forwarder | None, clock: Callable[[], float]) -> Gateway:
    settings = config.settings
    if store is not None and settings.tracker_id is None:  # the same origin as before
        config = replace(config, tracker_id=store.meta("tracker_id") or config.tracker_id)
    router = build_router(settings.router, seed=settings.seed, origin=config.tracker_id,
                          clock=clock)
    embeddings = build_embeddings_router(router, seed=settings.seed)
    telemetry = Telemetry(router, ClientEvents(),  # events name their request's client
                          embeddings_router=embeddings)
    mesh = Mesh(router, telemetry, settings.max_nodes, Listening.on(settings.host, settings.port))
    if settings.nodes_file:
        load_static_nodes(mesh, settings.nodes_file)
    forwarder = forwarder or AiohttpForwarder(settings.forward_timeouts())
    if isinstance(forwarder, AiohttpForwarder):
        telemetry.add_collector(forwarder.metric_families)
    providers = keeper = None
    gates = shared_gates(settings, config.tracker_id, clock)  # None when limits are local
    if settings.providers is not None:
        providers = ProviderRouter(settings.providers, gates)
        if config.gossip is not None:  # trackers learn provider routes as one
            gossip_providers(providers)
    if store is not None:
        keeper = StateKeeper(store, router, providers)
        keeper.restore(clock())
        telemetry.add_collector(keeper.metric_families)
    if gates is not None:
        telemetry.add_collector(gates.metric_families)
    spend = ClientSpend(client_store(settings), prices_of(settings.providers),
                        AccessCounters(), clock=clock, caps=caps_of(settings.providers))
    telemetry.add_client_collector(spend.counters.families, spend.counters.aggregate_families)
    gw = Gateway(config, router, telemetry, mesh, _NO_APP, providers, store, keeper, spend,
                 [], embeddings, forwarder=forwarder, gates=gates, clock=clock)
    gw.hedging = Hedging(config.settings.hedge_plan(), client_reserve(spend), telemetry.events)
    telemetry.add_collector(gw.hedging.metric_families)
    gw.chat = provider_chat(gw, config, telemetry)
    node_log = (NodeLog(store.path, config.tracker_id).open()
                if settings.share_node_writes and store is not None and store.path != MEMORY
                else None)
    gw.guard = RequestGuard(front(gw, lifespan=lambda app: _recorded(
        background_services(config, mesh, keeper, clock, providers, embeddings, node_log),
        gw.startup_failures, spend)), settings.guard(), reject=telemetry.reject,
        dialects=DIALECTS)
    gw.app = AccessLog(gw.guard, telemetry, ROUTED_PATHS,
                       clients=lambda: bool(gw.config.clients))
    if node_log is not None:  # a --workers worker: its node writes reach its siblings
        gw.app = ShareNodeWrites(gw.app, node_log)
    if settings.otlp_endpoint:  # the otlp extra, imported only now (docs/observability.md)
        from meshroute_middleware.telemetry import tracing
        gw.app = tracing.traced(gw.app, tracing.Tracing(
            settings.otlp_endpoint, tracing.parse_headers(settings.otlp_headers),
            settings.otlp_service_name, settings.otlp_content), ROUTED_PATHS,
            telemetry.add_collector)
    return gw


def provider_chat(gw: Gateway, config: GatewayConfig,
                  telemetry: Telemetry) -> ProviderChat | None:
    """The provider chain's server over the gateway's ProviderRouter, with `config`'s keys."""
    providers, gates, settings = gw.providers, gw.gates, config.settings
    if providers is None or gw.forwarder is None:
        return None
    return ProviderChat(providers, config.secrets, gw.forwarder, gw.router, telemetry,
                        timeouts=settings.forward_timeouts(),
                        request_timeout_s=settings.request_timeout_s, clock=gw.clock,
                        rng=random.Random(settings.seed),
                        acquire=None if gates is None
                        else functools.partial(gates.acquire, providers),
                        node_keys=config.node_secrets,
                        embeddings_router=gw.embeddings_router,
                        hedging=hedging_of(gw, settings), spend=gw.spend)


def front(gw: Gateway, lifespan: Lifespan | None = None) -> ASGIApp:
    """What serves a request under the guard, from `gw.config`: the middleware (clients,
    aliases, the provider chain) over the endpoints. Built again on a reload (app/reload.py);
    only the first one's `lifespan` (the background services) ever runs."""
    config, chat, providers, clock = gw.config, gw.chat, gw.providers, gw.clock
    settings, admin = config.settings, config.settings.admin_token or config.settings.node_token
    extra = [] if providers is None else ProviderRoutingAPI(
        providers, gw.router, clock=clock, admin_token=admin,
        max_body_bytes=settings.max_body_bytes, body_timeout_s=settings.body_timeout_s,
        refresh=None if gw.gates is None else gw.gates.refresh).routes()
    assert gw.spend is not None
    usage = UsageAPI(gw.spend, config.clients, admin_token=admin)
    extra = [*extra, *usage.routes()]
    inner: Starlette = build_api_app(GatewayAPI(
        gw.mesh, settings.node_token, admin_token=admin, warnings=config_warnings(config),
        providers=providers, embeddings_router=gw.embeddings_router,
        embeddings_providers=None if chat is None else chat.embeddings_providers,
        first_paint=FirstPaint(gw, usage)), extra)
    if lifespan is not None:
        inner.router.lifespan_context = lifespan
    # one guard in front of every endpoint, chat included (Host, Origin, Content-Type)
    middleware = replace(settings.middleware(), loop_marker=loop_marker(config.tracker_id),
                         clients=config.clients)
    return MeshRouteMiddleware(inner, middleware, router=gw.router, forwarder=gw.forwarder,
                               telemetry=gw.telemetry, providers=chat, spend=gw.spend,
                               aliases=settings.providers.aliases
                               if settings.providers else NO_ALIASES,
                               node_keys=config.node_secrets,
                               embeddings_router=gw.embeddings_router,
                               hedging=hedging_of(gw, settings))


def hedging_of(gw: Gateway, settings: ServeSettings) -> Hedging | None:
    """The gateway's hedging under `settings`' plan (a reload's too); None when off."""
    if gw.hedging is None:
        return None
    gw.hedging.configure(settings.hedge_plan())
    return gw.hedging if gw.hedging.plan.enabled else None


@contextlib.asynccontextmanager
async def _recorded(services: AbstractAsyncContextManager[None],
                    failures: list[BaseException],
                    spend: ClientSpend | None = None) -> AsyncIterator[None]:
    """The background services, their start-up failure kept in `failures`; at shutdown,
    the clients' owed settles are tried once more."""
    entered = False
    try:
        async with services:
            entered = True
            try:
                yield
            finally:
                if spend is not None:
                    await spend.aclose()
    except BaseException as exc:
        if not entered:
            failures.append(exc)
        raise


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
        try:
            mesh.upsert(record)
        except InvalidNodeError as exc:  # a URL of the gateway itself (a loop)
            raise ValueError(f"{path}: {exc}") from exc
