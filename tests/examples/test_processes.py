"""examples/node_agent and examples/gossip: real `meshroute` processes on 127.0.0.1."""

from __future__ import annotations

import re

from .run import run_example


def test_node_agent_in_front_of_an_openai_compatible_server() -> None:
    out = run_example("node_agent/run.py")
    assert "tracker discovered: ['stub-node']" in out, out
    assert "chat (stream=False): HTTP 200 via tiny|stub-node[0-23]" in out, out
    assert "chat (stream=True): HTTP 200 via tiny|stub-node[0-23]" in out, out
    assert "answer: the mesh routes" in out, out
    learned = re.search(r"learned: tiny\|stub-node\[0-23\] ([\d.]+) tok/s after 2 samples", out)
    assert learned and float(learned.group(1)) > 0, out


def test_two_trackers_gossiping() -> None:
    out = run_example("gossip/run.py")
    assert "tracker a served 12 requests; tracker b served none" in out, out
    rows = re.findall(r"tiny\|(\w+)\[0-23\]\s+([\d.]+) tok/s\s+samples\s+(\d+)\s+from 1 ", out)
    assert rows, out
    assert sum(int(samples) for _, _, samples in rows) >= 12  # a's measurements reached b
