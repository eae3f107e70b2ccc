"""meshroute: a learned router for LLM chat traffic.

The names below are loaded on first use (PEP 562): importing the package itself loads nothing
else, so that the `meshroute` command (`__main__`) is ready for a Ctrl-C before any heavy
module loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import GatewayAPI
    from .core import Decision, NodeRecord, Outcome, Router, RouterConfig, parse_node
    from .mesh import Mesh
    from .middleware import MeshRouteMiddleware, MiddlewareConfig, build_router
    from .telemetry.metrics import Telemetry

# public name -> the module (relative to this package) that defines it
_HOMES = {
    "Decision": ".core", "NodeRecord": ".core", "Outcome": ".core", "Router": ".core",
    "RouterConfig": ".core", "parse_node": ".core",
    "MeshRouteMiddleware": ".middleware", "MiddlewareConfig": ".middleware",
    "build_router": ".middleware", "GatewayAPI": ".api", "Mesh": ".mesh",
    "Telemetry": ".telemetry.metrics",
}
__all__ = [
    "Decision", "GatewayAPI", "Mesh", "MeshRouteMiddleware", "MiddlewareConfig", "NodeRecord",
    "Outcome", "Router", "RouterConfig", "Telemetry", "build_router", "parse_node",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """An exported name, imported from its module when first asked for."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home, __name__), name)
