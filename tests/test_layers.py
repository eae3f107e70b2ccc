"""The import-linter contracts hold on the real tree and catch a cycle between the adapter
packages: each case copies the packages to a temporary directory, adds one import, and runs
`lint-imports` there (pyproject.toml's `[tool.importlinter]`, unchanged)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("meshroute_middleware", "gossip", "node_agent")
LINT = Path(sys.executable).with_name("lint-imports")
# An added line (module, import) -> the contract's complaint about it.
BREAKS = {
    # http/ imports chat/, which imports http/: the chat <-> http cycle issue 36 removed
    "cycle": ("meshroute_middleware/http/errors.py",
              "import meshroute_middleware.chat.dialects  # noqa: F401"),
    # two independent siblings (mesh | forwarding | state): neither may import the other
    "sibling": ("meshroute_middleware/forwarding/client.py",
                "import meshroute_middleware.state.limits  # noqa: F401"),
    # the dialects' wire formats stay pure (no ASGI, no I/O)
    "impure wire": ("meshroute_middleware/chat/dialects/wire/anthropic.py",
                    "import starlette.types  # noqa: F401"),
}


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports on the packages under `tree`, with the project's contracts."""
    return subprocess.run([str(LINT), "--no-cache", str(tree / "pyproject.toml")], cwd=tree,
                          env={"PYTHONPATH": str(tree), "PATH": str(LINT.parent)},
                          capture_output=True, text=True, timeout=120)


def copy_tree(to: Path) -> Path:
    for name in PACKAGES:
        shutil.copytree(ROOT / name, to / name,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "static"))
    shutil.copy(ROOT / "pyproject.toml", to / "pyproject.toml")
    return to


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return copy_tree(tmp_path_factory.mktemp("layers"))


def test_the_real_tree_keeps_every_contract(pristine: Path) -> None:
    result = lint(pristine)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize("case", sorted(BREAKS))
def test_an_added_import_across_the_layers_breaks_a_contract(case: str,
                                                              tmp_path: Path) -> None:
    tree = copy_tree(tmp_path)
    module, line = BREAKS[case]
    path = tree / module
    path.write_text(path.read_text() + "\n" + line + "\n")
    result = lint(tree)
    assert result.returncode != 0, result.stdout
    assert "BROKEN" in result.stdout
    dotted = module.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
    assert dotted in result.stdout, result.stdout
