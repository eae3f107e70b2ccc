"""Running an example as a user would: `python examples/<name>/<script>.py`, bounded in time."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TIMEOUT_S = 180.0  # only bounds a hang: a loaded machine starts processes slowly


def run_example(script: str, *args: str) -> str:
    """Run examples/<script> to its end; its stdout (the test fails on a non-zero exit)."""
    return _run(script, *args).stdout


def run_example_output(script: str, *args: str) -> tuple[str, str]:
    """Run examples/<script> to its end; its (stdout, stderr)."""
    proc = _run(script, *args)
    return proc.stdout, proc.stderr


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args],
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    return proc


def load_example(script: str) -> object:
    """Import examples/<script> as a module (it is not a package)."""
    import importlib.util

    path = EXAMPLES / script
    spec = importlib.util.spec_from_file_location(path.parent.name + "_" + path.stem, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
