"""The side server: the tracker's endpoints and the relay on 127.0.0.1 while mitmproxy runs.

uvicorn serves `GatewayAPI`'s routes (/v1/routing, /v1/routing/events, /metrics, /dashboard,
/v1/nodes, ...) plus the relay, inside mitmproxy's own event loop, so the addon, the relay and
the endpoints share one Router without locks. Its ASGI lifespan runs the gateway's background
services (route pruning, gossip, mDNS discovery or health checks), composed as
`meshroute serve` composes them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Generator
from dataclasses import replace

import uvicorn
from starlette.routing import Route
from starlette.types import ASGIApp

from meshroute_middleware.api import GatewayAPI, build_api_app
from meshroute_middleware.app.config import GatewayConfig, config_warnings
from meshroute_middleware.app.mitm.relay import RELAY_PATH, Relay
from meshroute_middleware.app.services import background_services
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.http.guard import RequestGuard
from meshroute_middleware.mesh import Mesh

HOST = "127.0.0.1"
STARTUP_TIMEOUT_S = 10.0


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: mitmproxy owns Ctrl-C."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


def build_side_app(settings: ServeSettings, mesh: Mesh, relay: Relay, tracker_id: str,
                   port: int) -> ASGIApp:
    """The side server's app: GatewayAPI routes, the relay, the background services, behind
    the gateway's request guard (Host, Origin, Content-Type; the relay has its ticket)."""
    announced = replace(settings, host=HOST, port=port)  # discovery announces this address
    config = GatewayConfig.build(replace(announced, tracker_id=tracker_id))
    app = build_api_app(GatewayAPI(mesh, settings.node_token, warnings=config_warnings(config)),
                        [Route(RELAY_PATH, relay, methods=["POST"])])
    app.router.lifespan_context = lambda _: background_services(config, mesh)
    guard = replace(announced.guard(), ticket_paths=frozenset({RELAY_PATH}))
    return RequestGuard(app, guard, reject=mesh.telemetry.reject)


class SideServer:
    """Starts and stops the side server in the running event loop."""

    def __init__(self, app: ASGIApp, port: int) -> None:
        # X-Forwarded-For from loopback only: the addon names the proxy's client in it
        config = uvicorn.Config(app, host=HOST, port=port, log_level="warning",
                                lifespan="on", access_log=False, proxy_headers=True,
                                forwarded_allow_ips=HOST)
        self._server = _Server(config)
        self._task: asyncio.Task[None] | None = None
        self.url = ""

    async def start(self) -> str:
        """Serve; return the base URL once listening (RuntimeError if it cannot start)."""
        server = self._server
        self._task = asyncio.ensure_future(server.serve())
        async with asyncio.timeout(STARTUP_TIMEOUT_S):
            while not server.started:
                if self._task.done() or server.should_exit:
                    await self.stop()
                    raise RuntimeError(f"meshroute side server could not start on {HOST}:"
                                       f"{server.config.port}")
                await asyncio.sleep(0.01)
        port = server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://{HOST}:{port}"
        return self.url

    @property
    def port(self) -> int:
        """The bound port (after start)."""
        return int(self.url.rsplit(":", 1)[1])

    async def stop(self) -> None:
        """Stop serving and run the lifespan's shutdown."""
        self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(Exception, SystemExit):
                await self._task
            self._task = None
