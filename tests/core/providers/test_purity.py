"""The provider core stays pure: stdlib computation only, no I/O, no clock, no global rng."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import meshroute_middleware.core.providers as package

ALLOWED = {"__future__", "collections", "collections.abc", "dataclasses", "datetime",
           "email.utils", "enum", "functools", "math", "random", "re", "typing"}
# ... and the mesh's prefill fit (stdlib arithmetic only): affinity learns what a provider's
# cache hit saves by the same rule (one rule, issue 35), not a copy of it
CORE_ALLOWED = {"errors", "capabilities", "aliases", "objectives", "defaults",
                "policies.prefill"}
MODULES = sorted(Path(package.__file__).parent.glob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_imports_are_pure(path: Path) -> None:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 1:  # a sibling module of this package
                continue
            if node.level == 2:  # the core above: its errors, pure contracts, capability names
                module = node.module or ""
                assert module in CORE_ALLOWED or module.startswith("contracts."), (
                    f"{path.name} imports ..{module}")
                continue
            names = [node.module or ""]
        else:
            continue
        for name in names:
            assert name in ALLOWED, f"{path.name} imports {name}"


@pytest.mark.parametrize("path", MODULES, ids=[p.name for p in MODULES])
def test_no_clock_and_no_module_level_rng(path: Path) -> None:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "random":
                assert node.attr == "Random", f"{path.name} uses random.{node.attr}"
            assert node.value.id not in {"time", "os", "socket"}, path.name
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            assert node.func.attr not in {"now", "utcnow", "today", "open"}, (
                f"{path.name} calls .{node.func.attr}()")
