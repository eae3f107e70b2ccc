"""Running a gateway: uvicorn on a socket bound beforehand (a port in use is one line, not a
traceback), with the HTTP edge's limits, the garbage collector paced on its loop, and a stop
that no open stream holds (app/drain.py)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import threading
from collections.abc import Callable, Generator
from types import FrameType

import anyio
import uvicorn
from starlette.types import ASGIApp

from meshroute_middleware.app.drain import Drain
from meshroute_middleware.app.edge import edge_protocol
from meshroute_middleware.app.gateway import Gateway
from meshroute_middleware.app.gcpace import GC_FULL_AFTER, GcPacer
from meshroute_middleware.app.reload import Reloader
from meshroute_middleware.app.settings import DEFAULT_DRAIN_TIMEOUT_S
from meshroute_middleware.core.errors import MeshRouteError
from node_agent.serving import one_line

# Once the gateway has drained (app/drain.py), what still runs is cancelled after this long:
# a backstop; in a drained gateway nothing is left that takes it.
SHUTDOWN_GRACE_S = 1
log = logging.getLogger("meshroute.serve")
# a --workers parent relays Ctrl-C to its workers as this (SIGTERM is its drain)
RELAYED_CTRL_C = signal.SIGUSR1


class StartupError(MeshRouteError):
    """The gateway could not start; the message says why in one line."""


class GatewayServer(uvicorn.Server):
    """uvicorn, draining the gateway as its shutdown starts: no new connection, the streams in
    flight finish within `drain_timeout_s`, then what is left is cut (app/drain.py). SIGTERM
    ends the process with status 0 once drained. A `relayed` server (a --workers child)
    leaves Ctrl-C to its parent, which relays it as SIGTERM."""

    def __init__(self, config: uvicorn.Config, drain: Drain, relayed: bool = False,
                 drain_timeout_s: float = DEFAULT_DRAIN_TIMEOUT_S,
                 reloader: Reloader | None = None) -> None:
        super().__init__(config)
        self.drain, self.relayed, self.drain_timeout_s = drain, relayed, drain_timeout_s
        self.reloader = reloader
        self.at_once = False  # Ctrl-C: what is in flight is cut, not waited for
        self._loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.relayed and sig == signal.SIGINT:
            return
        if sig in (signal.SIGTERM, RELAYED_CTRL_C):  # a stop asked for: exit 0, not re-raised
            self.at_once = self.at_once or sig == RELAYED_CTRL_C
            self.should_exit = True
            return
        self.at_once = True
        super().handle_exit(sig, frame)

    def _reload(self, sig: int, frame: FrameType | None) -> None:
        loop = self._loop
        if self.reloader is not None and loop is not None:
            loop.call_soon_threadsafe(self.reloader.soon)

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        """uvicorn's SIGINT and SIGTERM, with SIGHUP (reload) and the Ctrl-C a --workers
        parent relays."""
        with super().capture_signals():
            if threading.current_thread() is not threading.main_thread():
                yield
                return
            before = {signal.SIGHUP: signal.signal(signal.SIGHUP, self._reload),
                      RELAYED_CTRL_C: signal.signal(RELAYED_CTRL_C, self.handle_exit)}
            try:
                yield
            finally:
                for sig, handler in before.items():
                    signal.signal(sig, handler)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().startup(sockets)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        for server in self.servers:  # no new connection from now on
            server.close()
        for sock in sockets or []:
            sock.close()
        for connection in list(self.server_state.connections):
            connection.shutdown()  # idle ones close; busy ones close after their answer
        self.drain.stop_accepting()
        if self.drain.in_flight and not self.at_once:
            log.info("draining: %d request(s) in flight, %g s at most",
                     self.drain.in_flight, self.drain_timeout_s)
            if not await self.drain.settle(self.drain_timeout_s):
                log.warning("drain timeout: cutting %d request(s) short", self.drain.in_flight)
        self.drain.drain()
        await super().shutdown(sockets)


def server_config(gateway: Gateway, port: int | None = None,
                  app: ASGIApp | None = None) -> uvicorn.Config:
    """uvicorn's configuration for a gateway: its address and the HTTP edge's limits
    (app.edge: head size, header lines, head timeout, connections; uvicorn's own
    `limit_concurrency` is left off, ours refuses a connection at once); its log lines go
    through the command's handler (app/logs.py)."""
    settings = gateway.config.settings
    return uvicorn.Config(
        app or gateway.app, host=settings.host, port=settings.port if port is None else port,
        log_level=settings.log_level.lower(), log_config=None, lifespan="on",
        access_log=False, timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        http=edge_protocol(settings.edge_limits(), gateway.telemetry.reject))


def serve_gateway(gateway: Gateway, sock: socket.socket, relayed: bool = False,
                  reloader: Reloader | None = None) -> None:
    """Serve the gateway on a bound socket until stopped (SIGTERM drains, Ctrl-C cuts);
    SIGHUP runs `reloader`. StartupError when its background services cannot start."""
    drain = Drain(gateway.app, gateway.telemetry.events)
    config = server_config(gateway, app=drain)
    config.load()  # uvicorn's protocol and app wrappers are built now, so frozen too
    server = GatewayServer(config, drain, relayed, gateway.config.settings.drain_timeout_s,
                           reloader)
    if not _serve(gateway, server, [sock]):
        failures = gateway.startup_failures
        raise StartupError(f"cannot start: {one_line(failures[0])}" if failures
                           else "cannot start")


def _serve(gateway: Gateway, server: uvicorn.Server, sockets: list[socket.socket]) -> bool:
    """Run uvicorn with the garbage collector paced on its loop (app/gcpace.py), or with
    CPython's own on a settled heap (`--gc python`); False if it did not start."""
    if gateway.config.settings.gc == "python":
        settle_heap()
        try:
            server.run(sockets=sockets)
        except SystemExit:  # uvicorn's start-up failure
            return False
        return True
    pacer = GcPacer()
    gateway.telemetry.add_collector(pacer.metric_families)
    pacer.settle()
    started = True

    async def serve() -> None:
        nonlocal started
        async with anyio.create_task_group() as tg:
            tg.start_soon(pacer.run)
            try:
                await server.serve(sockets=sockets)
            except SystemExit:
                started = False
            finally:
                tg.cancel_scope.cancel()

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(serve())
    return started


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
