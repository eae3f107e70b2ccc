"""Each shared default and header name has one home (issue 36): a second definition fails here.

Scans the product packages' source (no import, so nothing is executed): module-level
assignments of the shared defaults, numeric defaults of an `explore_share` parameter or field,
and header-name literals (`x-meshroute-*`, `x-session-id`), which may appear in one module only.
"""

from __future__ import annotations

import ast
import functools
import re
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("meshroute_middleware", "gossip", "node_agent")
HOME = "meshroute_middleware/core/defaults.py"
SHARED = {"MAX_SKEW_S", "OBS_SIGMA", "SPEED_PRIOR", "EXPLORE_SHARE"}
HEADER = re.compile(r"x-meshroute-[a-z0-9-]*|x-session-id", re.IGNORECASE)


@functools.cache
def modules() -> dict[str, ast.Module]:
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(), str(p))
            for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))}


def assigned(tree: ast.Module) -> set[str]:
    """Names bound by the module's top-level assignments (imports are not definitions)."""
    names: set[str] = set()
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        for target in targets:
            names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def docstrings(tree: ast.Module) -> set[int]:
    """ids of the string constants that are docstrings (module, class, function)."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


def header_literals(tree: ast.Module) -> set[str]:
    skip = docstrings(tree)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in skip:
            value = node.value
            text = value.decode("latin-1") if isinstance(value, bytes) else value
            if isinstance(text, str) and HEADER.fullmatch(text):
                found.add(text.lower())
    return found


def numeric_explore_defaults(tree: ast.Module) -> list[int]:
    """Lines where an `explore_share` parameter or field defaults to a number literal."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arguments):
            args = [*node.posonlyargs, *node.args]
            pairs = [*zip(args[len(args) - len(node.defaults):], node.defaults, strict=True),
                     *zip(node.kwonlyargs, node.kw_defaults, strict=True)]
            lines += [d.lineno for a, d in pairs if a.arg == "explore_share"
                      and isinstance(d, ast.Constant) and not isinstance(d.value, str)]
        elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
              and node.target.id == "explore_share" and isinstance(node.value, ast.Constant)):
            lines.append(node.lineno)
    return lines


def test_each_shared_default_is_defined_once_in_its_home() -> None:
    homes: dict[str, list[str]] = defaultdict(list)
    for path, tree in modules().items():
        for name in assigned(tree) & SHARED:
            homes[name].append(path)
    assert dict(homes) == {name: [HOME] for name in SHARED}


def test_no_explore_share_default_is_a_copied_number() -> None:
    found = {path: lines for path, tree in modules().items()
             if (lines := numeric_explore_defaults(tree))}
    assert found == {}, "use core.defaults.EXPLORE_SHARE"


def test_each_header_name_is_spelled_in_one_module() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path, tree in modules().items():
        for name in header_literals(tree):
            where[name].append(path)
    twice = {name: paths for name, paths in where.items() if len(paths) > 1}
    assert twice == {}, "import the header name from its home instead"
    assert "x-meshroute-route" in where and "x-session-id" in where  # the scan sees them


def test_the_scan_sees_a_second_definition() -> None:
    tree = ast.parse('"""x-meshroute-plan"""\nOBS_SIGMA = 0.3\nH = b"x-meshroute-route"\n'
                     "def f(explore_share=0.3): ...\n")
    assert assigned(tree) & SHARED == {"OBS_SIGMA"}
    assert header_literals(tree) == {"x-meshroute-route"}
    assert numeric_explore_defaults(tree) == [4]
