"""`meshroute serve`: a tracker gateway, from flags + environment + TOML file.

Settings are loaded once (defaults < TOML < env < flags, app/settings.py), the listening
socket is bound and every part of the configuration that can be wrong is built and checked
before anything starts (app/config.py, app/gateway.py); then it serves until stopped
(app/run.py), or as several processes (app/workers.py). Any start-up failure is one line on
stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import signal
import socket
import sys
import threading
from dataclasses import replace

from meshroute_middleware.app.config import GatewayConfig, limits_store_name
from meshroute_middleware.app.edge import fit_descriptor_limit
from meshroute_middleware.app.gateway import (
    Gateway,
    build_gateway,
)
from meshroute_middleware.app.logs import configure_logging
from meshroute_middleware.app.reload import Reloader
from meshroute_middleware.app.run import StartupError, serve_gateway
from meshroute_middleware.app.settings import (
    ServeSettings,
    SettingsError,
    add_arguments,
    load_settings,
)
from meshroute_middleware.app.workers import (
    PORT_HINT,
    run_workers,
)
from meshroute_middleware.core.errors import MeshRouteError
from meshroute_middleware.state.store import StateStoreError
from node_agent.serving import ListenError, listen_socket

log = logging.getLogger("meshroute.serve")
__all__ = ["add_arguments", "run"]  # the subcommand's interface (app/cli.py)



class _Refused(MeshRouteError):
    """A start-up failure, as the one line the command prints."""


def run(args: argparse.Namespace) -> int:
    """Build the gateway from flags + env + file and serve it until interrupted."""
    cli = {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "command"}
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a reload before serving: not a death
    try:
        settings = load_settings(cli, os.environ)
        reread = functools.partial(load_settings, cli, os.environ)
        if settings.workers > 1:
            return run_workers(settings, reread)
        gateway, sock = _start(settings)
    except _Refused as exc:
        print(f"meshroute serve: {exc}", file=sys.stderr)
        return 2
    except (SettingsError, ValueError, StateStoreError) as exc:
        print(f"meshroute serve: {exc}", file=sys.stderr)
        return 2
    settings = gateway.config.settings
    configure_logging(settings.log_level, gateway.config.every_secret(), settings.log_format)
    if gateway.providers is not None:
        cfg = gateway.providers.cfg
        log.info("%d provider(s), %d key(s)", len(cfg.providers),
                 sum(len(p.keys) for p in cfg.providers))
    if gateway.keeper is not None:
        log.info("state in %s (%d route statistics restored)", gateway.keeper.store.path,
                 gateway.keeper.restored)
    host = f"[{settings.host}]" if ":" in settings.host else settings.host
    log.info("tracker %s on http://%s:%d (policy %s; limits store: %s)",
             gateway.config.tracker_id, host, settings.port, settings.router.policy,
             limits_store_name(settings))
    fit_descriptor_limit(settings.max_connections)
    try:
        serve_gateway(gateway, sock, reloader=Reloader(gateway, reread, os.environ))
    except StartupError as exc:
        print(f"meshroute serve: {exc}", file=sys.stderr)
        return 2
    return 0


def _start(settings: ServeSettings) -> tuple[Gateway, socket.socket]:
    """The listening socket, then the gateway on its port (port 0 resolved)."""
    try:
        sock = listen_socket(settings.host, settings.port)
    except ListenError as exc:
        raise _Refused(f"{exc.strerror}; {PORT_HINT}") from exc
    try:
        settings = replace(settings, port=int(sock.getsockname()[1]))
        return build_gateway(GatewayConfig.build(settings, os.environ)), sock
    except BaseException:
        sock.close()
        raise
