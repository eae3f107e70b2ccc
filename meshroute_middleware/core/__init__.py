"""The pure routing core: topology, enumeration, statistics, policies. No I/O, no clock."""

from meshroute_middleware.core.config import RouterConfig
from meshroute_middleware.core.errors import (
    InvalidNodeError,
    InvalidPinError,
    MeshRouteError,
    NoRouteError,
    UnknownModelError,
)
from meshroute_middleware.core.policies import Adr0021Policy, Arm, Outcome, Policy
from meshroute_middleware.core.policies.registry import make_policy, register_policy
from meshroute_middleware.core.router import Decision, Router
from meshroute_middleware.core.routes import Hop, Route, enumerate_routes, pinned_route
from meshroute_middleware.core.stats import RouteStatsStore, RouteView, StatEntry
from meshroute_middleware.core.topology import NodeRecord, Topology, parse_node

__all__ = [
    "Adr0021Policy",
    "Arm",
    "Decision",
    "Hop",
    "InvalidNodeError",
    "InvalidPinError",
    "MeshRouteError",
    "NoRouteError",
    "NodeRecord",
    "Outcome",
    "Policy",
    "Route",
    "RouteStatsStore",
    "RouteView",
    "Router",
    "RouterConfig",
    "StatEntry",
    "Topology",
    "UnknownModelError",
    "enumerate_routes",
    "make_policy",
    "parse_node",
    "pinned_route",
    "register_policy",
]
