"""The README's one-command try (examples/providers/try.py) really works on loopback."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "providers" / "try.py"


def test_the_example_try_runs_the_example_config() -> None:
    proc = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "-> 200 route=fastco/big-model#1 tried=fastco/big-model#1" in out
    assert "-> 200 route=fastco/big-model#2 tried=fastco/big-model#2" in out
    # a 429, then the other key (which one is next depends on the 'auto' request before it)
    assert re.search(r"429 cools.*-> 200 route=fastco/big-model#(\d) "
                     r"tried=fastco/big-model#(?!\1)\d,fastco/big-model#\1", out)
    assert "fastco/big-model#1: cooldown for" in out
    assert "fastco got model='big-model' with $FASTCO_KEY_A" in out
    assert "demo-fastco-key" not in out + proc.stderr
