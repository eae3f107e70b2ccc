"""Every example runs with only what its README installs, its commands use the venv of the
README's first command, and every runnable example is run by a test."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

import pytest

from .run import EXAMPLES

ROOT = EXAMPLES.parent
PROJECT = {"meshroute_middleware", "gossip", "node_agent"}
# What an example's README installs beyond `.venv/bin/pip install -e .`, as the README says it.
EXTRAS = {"fastapi_annotate": ({"fastapi"}, ".venv/bin/pip install fastapi"),
          "mitm": ({"mitmproxy"}, "scripts/mitm-venv")}
# The test that runs each runnable example (a script with a __main__ block), and how it names it.
ANNOTATE = "tests/examples/test_annotate_apps.py"
RUN_BY = {
    "starlette_annotate/app.py": (ANNOTATE, "starlette_annotate/app.py"),
    "fastapi_annotate/app.py": (ANNOTATE, "fastapi_annotate/app.py"),
    "node_agent/run.py": ("tests/examples/test_processes.py", "node_agent/run.py"),
    "gossip/run.py": ("tests/examples/test_processes.py", "gossip/run.py"),
    "providers/try.py": ("tests/examples/test_providers.py", "providers/try.py"),
    "providers/try_clients.py": ("tests/examples/test_providers.py",
                                 "providers/try_clients.py"),
    "mitm/run.py": ("tests/mitm/test_example.py", '"mitm" / "run.py"'),
    # started by node_agent/run.py, gossip/run.py and mitm/run.py
    "node_agent/stub_server.py": ("examples/node_agent/run.py", "stub_server.py"),
}
SHELL = re.compile(r"```(?:bash|sh)\n(.*?)```", re.S)
COMMAND = re.compile(
    r"^(\.venv/bin/|\.venv-mitm/bin/|scripts/|curl |bash |python3 -m venv \.venv$)")


def _declared() -> set[str]:
    """The distributions `pip install -e .` installs directly (the project's dependencies)."""
    with open(ROOT / "pyproject.toml", "rb") as f:
        deps = tomllib.load(f)["project"]["dependencies"]
    return {re.match(r"[A-Za-z0-9_.-]+", dep).group().lower() for dep in deps}  # type: ignore[union-attr]


def _imports(path: Path) -> set[str]:
    """The top-level modules a script imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - {"__future__"}


SCRIPTS = sorted(EXAMPLES.rglob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_each_example_imports_only_what_its_readme_installs(script: Path) -> None:
    example = script.relative_to(EXAMPLES).parts[0]
    extras, how = EXTRAS.get(example, (set(), ""))
    siblings = {p.stem for folder in (EXAMPLES, script.parent) for p in folder.glob("*.py")}
    allowed = set(sys.stdlib_module_names) | PROJECT | siblings | _declared() | extras
    assert _imports(script) - allowed == set()
    if extras:
        assert how in (script.parent / "README.md").read_text()


def test_every_readme_command_runs_from_the_first_commands_venv() -> None:
    strays = []
    for readme in [ROOT / "README.md", *sorted(EXAMPLES.rglob("README.md"))]:
        for block in SHELL.findall(readme.read_text()):
            for line in block.splitlines():
                command = line.split("#", 1)[0].strip()
                if not command or line.startswith((" ", "\t")):  # a comment or a continuation
                    continue
                strays += [f"{readme.relative_to(ROOT)}: {part.strip()}"
                           for part in command.split("&&") if not COMMAND.match(part.strip())]
    assert strays == []


def test_every_runnable_example_is_run_by_a_test() -> None:
    runnable = {str(p.relative_to(EXAMPLES)) for p in SCRIPTS
                if '__name__ == "__main__"' in p.read_text()}
    assert runnable == set(RUN_BY)
    for by, named in RUN_BY.values():
        assert named in (ROOT / by).read_text(), by
