"""examples/node_agent and examples/gossip: real `meshroute` processes on 127.0.0.1."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator

import pytest

from .run import run_example

NODE = r"stub-node-[0-9a-f]{6}"


def _check_node_agent_example(out: str) -> None:
    assert re.search(rf"tracker discovered: \['{NODE}'\]", out), out
    assert re.search(rf"chat \(stream=False\): HTTP 200 via tiny\|{NODE}\[0-23\]", out), out
    assert re.search(rf"chat \(stream=True\): HTTP 200 via tiny\|{NODE}\[0-23\]", out), out
    assert "answer: the mesh routes" in out, out
    learned = re.search(rf"learned: tiny\|{NODE}\[0-23\] ([\d.]+) tok/s after 2 samples",
                        out)
    assert learned and float(learned.group(1)) > 0, out


def test_node_agent_in_front_of_an_openai_compatible_server() -> None:
    _check_node_agent_example(run_example("node_agent/run.py"))


@pytest.fixture
def neighbours() -> Iterator[None]:
    """Two unsigned emulated nodes announcing the example's own model on loopback mDNS
    (what another example or the demo nearby does), one of them much faster."""
    procs = [subprocess.Popen(
        [sys.executable, "-m", "meshroute_middleware.app.cli", "node", "--emulate",
         "--host", "127.0.0.1", "--port", "0", "--mdns-interfaces", "127.0.0.1",
         "--model", "tiny", "--shard", "0-23", "--layers", "24", "--node-id", node_id,
         "--tps", tps, "--fail-share", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for node_id, tps in (("neighbour-a", "5000"), ("neighbour-b", "20"))]
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(15)


def test_node_agent_example_uses_only_its_own_node(neighbours: None) -> None:
    """Nodes announced nearby never join the example's mesh: it discovers, routes to and
    learns only its own node (they used to be taken for it: `KeyError: 'choices'`)."""
    _check_node_agent_example(run_example("node_agent/run.py"))


def test_two_trackers_gossiping() -> None:
    out = run_example("gossip/run.py")
    assert "tracker a served 12 requests; tracker b served none" in out, out
    rows = re.findall(r"tiny\|(\w+)\[0-23\]\s+([\d.]+) tok/s\s+samples\s+(\d+)\s+from 1 ", out)
    assert rows, out
    assert sum(int(samples) for _, _, samples in rows) >= 12  # a's measurements reached b
