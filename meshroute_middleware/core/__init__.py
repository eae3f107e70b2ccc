"""The pure routing core: topology, enumeration, statistics, policies. No I/O, no clock."""

from .config import RouterConfig
from .decision import Decision
from .errors import (
    InvalidNodeError,
    InvalidPinError,
    MeshRouteError,
    NoRouteError,
    UnknownModelError,
)
from .policies import Adr0021Policy, Arm, Outcome, Policy
from .policies.registry import make_policy, register_policy
from .router import Router
from .routes import Hop, Route, enumerate_routes, pinned_route
from .stats import RouteStatsStore, RouteView, StatEntry
from .topology import NodeRecord, Topology, parse_node

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
