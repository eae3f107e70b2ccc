"""examples/mitm/run.py as a user runs it (in the mitm venv): real mitmdump with the addon."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mitmproxy")

RUN = Path(__file__).resolve().parents[2] / "examples" / "mitm" / "run.py"


def test_the_mitm_example_routes_and_learns() -> None:
    proc = subprocess.run([sys.executable, str(RUN)], capture_output=True, text=True,
                          timeout=180)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    chats = re.findall(r"chat \d \(stream=(True|False)\): HTTP (\d+) via tiny\|(\w+)\[0-23\]",
                       proc.stdout)
    assert len(chats) == 8 and all(status == "200" for _, status, _ in chats), proc.stdout
    samples = [int(n) for n in re.findall(r"samples (\d+)", proc.stdout)]
    assert sum(samples) >= 8, proc.stdout
