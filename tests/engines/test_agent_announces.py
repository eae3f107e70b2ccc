"""What a `meshroute node` agent in front of a live llama-server announces, as the gateway
sees it in /v1/nodes (issue 31): after a `max_tokens: 1` answer not 1,000,000 tok/s but the
configured figure, then the decode speed of real answers; one slot's context as its cache
capacity, and no hit rate from the last prompt of an idle slot."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import httpx

from .conftest import Mesh, start_mesh, until

CONFIGURED_TPS = 10.0  # `meshroute node` without --tps
SETTLE_S = 4.0  # the agent reads every second and re-announces at most once a second


def answer(mesh: Mesh, node_id: str, max_tokens: int, content: str) -> dict[str, Any]:
    """One answer straight from the server (not through the gateway); its timings."""
    got = httpx.post(mesh.servers[node_id].url + "/v1/chat/completions", timeout=180, json={
        "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": True})
    assert got.status_code == 200, got.text
    timings: dict[str, Any] = got.json()["timings"]
    return timings


def test_the_gateway_sees_what_the_server_measured(tmp_path: Path) -> None:
    # a node id of this process's own: other processes' engine tests announce theirs on the
    # same loopback mDNS domain, with the same per-process mesh numbers
    mesh = start_mesh(tmp_path, names=(f"readings{os.getpid()}",))
    try:
        (node_id,) = mesh.servers
        answer(mesh, node_id, 1, "Say hi.")
        time.sleep(SETTLE_S)
        node = mesh.nodes()[node_id]
        assert node["tps"] == CONFIGURED_TPS, node  # 1 token in 1 µs is no speed
        # a slot holds its context (/props n_ctx: LlamaServer gives each slot 8,192); its
        # last prompt is no capacity, and one cold prompt no hit rate
        assert node.get("cache_tokens") == 8192 and "cache_hit" not in node, node

        # 160 tokens: over the window's 1 s of decoding even on a quiet machine
        timings = answer(mesh, node_id, 160, "Write a short story about a fox.")
        measured = timings["predicted_per_second"]
        until(lambda: mesh.nodes()[node_id]["tps"] != CONFIGURED_TPS,
              "the agent announces the measured speed", 30.0)
        announced = mesh.nodes()[node_id]["tps"]
        print(f"gateway sees {announced:.1f} tok/s, the server measured {measured:.1f}")
        assert measured / 2 <= announced <= measured * 2
    finally:
        mesh.close()
