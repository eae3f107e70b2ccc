"""Pins the public surface: changing an export list must be a deliberate edit of this file."""

from __future__ import annotations

import meshroute_middleware
import meshroute_middleware.core as core

CORE = {
    "Adr0021Policy", "Arm", "Decision", "Hop", "InvalidNodeError", "InvalidPinError",
    "MeshRouteError", "NoRouteError", "NodeRecord", "Outcome", "Policy", "Route",
    "RouteStatsStore", "RouteView", "Router", "RouterConfig", "StatEntry", "Topology",
    "UnknownModelError", "enumerate_routes", "make_policy", "parse_node",
    "pinned_route", "register_policy",
}
TOP = {"Decision", "NodeRecord", "Outcome", "Router", "RouterConfig", "parse_node"}


def test_core_exports() -> None:
    assert set(core.__all__) == CORE
    assert len(core.__all__) == len(CORE)  # no name listed twice
    for name in core.__all__:
        assert getattr(core, name).__module__.startswith("meshroute_middleware.core"), name


def test_top_level_exports_are_the_core_objects() -> None:
    assert set(meshroute_middleware.__all__) == TOP
    for name in meshroute_middleware.__all__:
        assert getattr(meshroute_middleware, name) is getattr(core, name)
    assert isinstance(meshroute_middleware.__version__, str)
