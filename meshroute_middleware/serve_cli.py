"""`meshroute serve`: run a tracker gateway with uvicorn."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from .settings import SettingsError, load_settings
from .settings import add_arguments as add_settings


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Every ServeSettings option as a flag."""
    add_settings(parser)


def run(args: argparse.Namespace) -> int:
    """Build the gateway from flags + env + file and serve it until interrupted."""
    import uvicorn

    from .server import build_gateway

    cli = {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "command"}
    try:
        settings = load_settings(cli, os.environ)
        if settings.mdns:
            from node_agent.mdns import parse_interfaces

            parse_interfaces(settings.mdns_interfaces)  # refuse a bad value before starting
        if settings.gossip_listen or settings.gossip_peers:
            from gossip.service import GossipConfig

            GossipConfig.from_settings(settings)  # addresses and the secret, before starting
        gateway = build_gateway(settings)
    except (SettingsError, ValueError) as exc:
        print(f"meshroute serve: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    print(f"meshroute serve: tracker {gateway.tracker_id} on "
          f"http://{settings.host}:{settings.port} (policy {settings.router.policy})",
          file=sys.stderr, flush=True)
    uvicorn.run(gateway.app, host=settings.host, port=settings.port,
                log_level=settings.log_level.lower(), lifespan="on", access_log=False)
    return 0
