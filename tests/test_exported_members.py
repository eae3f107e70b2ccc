"""Pins the public surface: changing an export list must be a deliberate edit of this file."""

from __future__ import annotations

import importlib
import subprocess
import sys

import meshroute_middleware
import meshroute_middleware.core as core

CORE = {
    "Adr0021Policy", "Arm", "Decision", "Hop", "InvalidNodeError", "InvalidPinError",
    "MeshRouteError", "NoRouteError", "NodeRecord", "Outcome", "Policy", "Route",
    "RouteStatsStore", "RouteView", "Router", "RouterConfig", "StatEntry", "Topology",
    "UnknownModelError", "enumerate_routes", "make_policy", "parse_node",
    "pinned_route", "register_policy",
}
TOP_CORE = {"Decision", "NodeRecord", "Outcome", "Router", "RouterConfig", "parse_node"}
TOP_ADAPTERS = {  # the import paths the README and docs show, also at the package root
    "MeshRouteMiddleware": "meshroute_middleware.middleware",
    "MiddlewareConfig": "meshroute_middleware.middleware",
    "build_router": "meshroute_middleware.middleware",
    "GatewayAPI": "meshroute_middleware.api",
    "Mesh": "meshroute_middleware.mesh",
    "Telemetry": "meshroute_middleware.telemetry.metrics",
}


def test_core_exports() -> None:
    assert set(core.__all__) == CORE
    assert len(core.__all__) == len(CORE)  # no name listed twice
    for name in core.__all__:
        assert getattr(core, name).__module__.startswith("meshroute_middleware.core"), name


def test_top_level_exports_are_the_core_objects() -> None:
    assert set(meshroute_middleware.__all__) == TOP_CORE | set(TOP_ADAPTERS)
    assert len(meshroute_middleware.__all__) == len(TOP_CORE) + len(TOP_ADAPTERS)
    for name in TOP_CORE:
        assert getattr(meshroute_middleware, name) is getattr(core, name)
    assert isinstance(meshroute_middleware.__version__, str)


def test_top_level_exports_are_the_documented_adapters() -> None:
    for name, home in TOP_ADAPTERS.items():
        module = importlib.import_module(home)
        assert getattr(meshroute_middleware, name) is getattr(module, name), name


def test_importing_the_package_loads_no_adapter() -> None:
    code = ("import sys, meshroute_middleware; "
            "print(sorted(m for m in sys.modules if m.startswith('meshroute_middleware.')))")
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True).stdout.strip()
    assert loaded == "[]"
