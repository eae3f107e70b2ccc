"""`meshroute serve --workers N`: one port served by N processes (SO_REUSEPORT), each an
origin of its own, sharing what they learn over loopback gossip and the one state file."""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import os
import secrets
import signal
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import replace

from meshroute_middleware.app.config import (
    GatewayConfig,
    limits_store_name,
    new_tracker_id,
    workers_base_id,
)
from meshroute_middleware.app.gateway import build_gateway, open_state_file
from meshroute_middleware.app.limits import limits_mode
from meshroute_middleware.app.logs import configure_logging
from meshroute_middleware.app.reload import Reloader
from meshroute_middleware.app.run import RELAYED_CTRL_C, StartupError, serve_gateway
from meshroute_middleware.app.settings import ServeSettings, SettingsError
from meshroute_middleware.state.sqlite_limits import SqliteLimits
from meshroute_middleware.state.store import MEMORY, StateStoreError
from meshroute_middleware.telemetry.workers import WorkersDir, join_workers
from node_agent.serving import ListenError, listen_socket

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
log = logging.getLogger("meshroute.serve")
PORT_HINT = "choose another port with --port (0: any free port)"


def worker_settings(settings: ServeSettings, index: int, gossip_ports: list[int],
                    tracker_id: str, secret: str) -> ServeSettings:
    """Worker `index`'s settings: its own origin, gossip on loopback port `gossip_ports[index]`
    with every sibling (and any configured peer) as a static peer, under the per-run secret."""
    siblings = tuple(f"127.0.0.1:{p}" for i, p in enumerate(gossip_ports) if i != index)
    return replace(settings, workers=1, tracker_id=f"{tracker_id}-w{index}",
                   share_node_writes=(settings.state_file or MEMORY) != MEMORY,
                   limits_store=limits_mode(settings),  # one budget across the workers
                   gossip_listen=f"127.0.0.1:{gossip_ports[index]}",
                   gossip_peers=siblings + settings.gossip_peers, gossip_secret=secret,
                   gossip_secret_file=None, gossip_fanout=max(settings.gossip_fanout,
                                                              len(gossip_ports) - 1))


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


def _die_with(parent: int) -> None:
    """End this worker when its supervisor ends, even killed with SIGKILL (which leaves it no
    chance to stop its workers): Linux's PR_SET_PDEATHSIG sends SIGTERM, the signal a worker
    stops on. Elsewhere a supervisor killed that way leaves its workers running."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # it ended before the request was made
        os._exit(0)


def _serve_worker(settings: ServeSettings, parent: int, run: WorkersDir, index: int,
                  reread: Callable[[], ServeSettings] | None = None) -> None:
    """One worker process: its own gateway on its own SO_REUSEPORT socket of the shared port;
    SIGHUP (relayed by the parent) reloads its config, SIGTERM drains it."""
    _die_with(parent)
    # until its server handles them (app/run.py): a reload is not lost to a starting worker's
    # death, and a relayed Ctrl-C ends it
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(RELAYED_CTRL_C, lambda signum, frame: os._exit(0))
    try:
        gateway = build_gateway(GatewayConfig.build(settings, os.environ))
        gateway.app = join_workers(gateway.telemetry, gateway.app, run, index)  # one view
        configure_logging(settings.log_level,  # with this worker's keys scrubbed
                          gateway.config.every_secret(), settings.log_format)
        sock = listen_socket(settings.host, settings.port, reuse_port=True)
        serve_gateway(gateway, sock, relayed=True, reloader=None if reread is None
                      else Reloader(gateway, reread, os.environ))
    except (StartupError, ListenError, StateStoreError, ValueError) as exc:
        log.error("worker %s: %s", settings.tracker_id, exc)
        sys.exit(2)


def _reload_refused(running: ServeSettings, reread: Callable[[], ServeSettings]) -> bool:
    """Whether the config read again has an error (said in one line)."""
    try:
        fresh = reread()
        GatewayConfig.build(replace(running, providers=fresh.providers, clients=fresh.clients),
                            os.environ)
    except (SettingsError, ValueError, StateStoreError) as exc:
        log.error("reload refused, the running config kept: %s", exc)
        return True
    return False


def run_workers(settings: ServeSettings,
                reread: Callable[[], ServeSettings] | None = None) -> int:
    """Serve one port with `settings.workers` processes (SO_REUSEPORT: the kernel spreads
    connections over them). Each worker is an origin of its own; they gossip learned
    statistics over loopback ports derived here, authenticated with a secret made for this
    run. Nodes reach every worker: mDNS, --nodes-file, or POST /v1/nodes and DELETE, which
    reach one and are shared through the state file (app/nodeshare.py).
    The state file is opened (created 0600) here first, then by each worker: each writes
    its own origin's rows to it."""
    if settings.gossip_listen:
        print("meshroute serve: --workers gossips on loopback ports of its own; "
              "--gossip-listen cannot be combined with it", file=sys.stderr)
        return 2
    n = settings.workers
    # the parent holds the port (bound, not listening) so that port 0 resolves once
    try:
        holder = listen_socket(settings.host, settings.port, reuse_port=True, listen=False)
    except ListenError as exc:
        print(f"meshroute serve: {exc.strerror}; {PORT_HINT}", file=sys.stderr)
        return 2
    port = int(holder.getsockname()[1])
    tracker_id = settings.tracker_id or new_tracker_id()
    secret, gossip_ports = secrets.token_hex(32), _free_ports(n)
    shared = replace(settings, port=port)
    children = []
    try:
        store = open_state_file(shared)  # refuse an unusable state file (the workers share it)
        if store is not None:
            if settings.tracker_id is None:  # the same origins as the last run's workers
                tracker_id = workers_base_id(store.meta("tracker_id")) or tracker_id
            store.close()
            if limits_mode(shared) == "state-file" and store.path != MEMORY:
                SqliteLimits.new_run(store.path)
        configs = [worker_settings(shared, i, gossip_ports, tracker_id, secret)
                   for i in range(n)]
        for cfg in configs:
            GatewayConfig.build(cfg, os.environ)  # and a bad one before any process starts
    except (SettingsError, ValueError, StateStoreError) as exc:
        holder.close()
        print(f"meshroute serve: {exc}", file=sys.stderr)
        return 2
    configure_logging(settings.log_level, fmt=settings.log_format)
    log.info("%d workers (%s-w0..w%d) on http://%s:%d (policy %s; limits store: %s), "
             "gossiping on 127.0.0.1:%s", n, tracker_id, n - 1, settings.host, port,
             settings.router.policy, limits_store_name(configs[0]),
             ",".join(map(str, gossip_ports)))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a reload while the workers start: lost
    context = multiprocessing.get_context("fork")  # no event loop exists yet to inherit
    run = WorkersDir.create(n)  # metric files and event sockets: telemetry/workers.py
    for index, cfg in enumerate(configs):
        child = context.Process(target=_serve_worker,
                                args=(cfg, os.getpid(), run, index, reread),
                                daemon=False)
        child.start()
        children.append(child)

    def relay(signum: int) -> None:
        for child in children:
            if child.is_alive() and child.pid is not None:
                os.kill(child.pid, signum)

    def stop(signum: int, frame: object) -> None:
        """SIGTERM: each worker drains; Ctrl-C: each stops at once (run.RELAYED_CTRL_C)."""
        relay(signal.SIGTERM if signum == signal.SIGTERM else RELAYED_CTRL_C)

    def reload(signum: int, frame: object) -> None:
        """SIGHUP: the config checked here (one line when it has an error, and the workers
        keep theirs), then each worker reloads it."""
        if reread is None or _reload_refused(configs[0], reread):
            return
        relay(signal.SIGHUP)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, reload)
    code = 0
    try:
        while children:  # one worker gone for good ends the whole server
            ended = [c for c in children if not c.is_alive()]
            if ended:
                run.ended(ended[0].pid or 0)
                code = code or (ended[0].exitcode or 0)
                stop(signal.SIGTERM, None)
                for child in children:  # a draining worker: its streams' time, and more
                    child.join(settings.drain_timeout_s + 10)
                break
            time.sleep(0.2)
    finally:
        holder.close()
        run.remove()
    return 0 if code in (0, -signal.SIGTERM) else 1
