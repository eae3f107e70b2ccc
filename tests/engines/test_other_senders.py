"""Requests another sender put on a real llama-server count as load at the gateway (issue
31): the node agent reads the server's busy slots and announces them as `held`; the gateway
takes what is not its own as the others' requests (core/node_load.py). The time from the
server taking the requests to the gateway counting them is printed (the staleness of its
view; docs/architecture.md, "One node, several trackers"), not asserted."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx

from .conftest import Mesh, until

ANSWER_TOKENS = 120  # ~10 s of decoding on one thread: the gateway sees them running


def in_flight(mesh: Mesh) -> dict[str, int]:
    try:
        routing = httpx.get(mesh.gateway + "/v1/routing", timeout=10).json()
        rows = routing["models"][mesh.model]["candidates"]
    except (httpx.TransportError, ValueError, KeyError):
        return {}
    return {row["head"]: row["in_flight"] for row in rows}


def direct(url: str) -> dict[str, Any]:
    """A request sent to the server itself, past the gateway."""
    body = {"messages": [{"role": "user", "content": "Count slowly from one to a thousand."}],
            "max_tokens": ANSWER_TOKENS, "temperature": 0, "ignore_eos": True}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=300).json()


def test_requests_sent_to_the_server_directly_are_load_at_the_gateway(mesh: Mesh) -> None:
    busy, idle = sorted(mesh.servers)
    until(lambda: in_flight(mesh).get(busy) == 0, "the gateway sees the server idle")
    with ThreadPoolExecutor(2) as pool:
        sent = time.monotonic()
        answers = [pool.submit(direct, mesh.servers[busy].url) for _ in range(2)]
        until(lambda: in_flight(mesh).get(busy) == 2, "the gateway counts both as load")
        seen_s = time.monotonic() - sent
        assert in_flight(mesh).get(idle) == 0  # the other server's count is its own
        for answer in answers:
            assert answer.result()["usage"]["completion_tokens"] > 0
        ended = time.monotonic()
    until(lambda: in_flight(mesh).get(busy) == 0, "the gateway sees them end")
    print(f"others' requests seen after {seen_s:.2f} s (from sending), their end after "
          f"{time.monotonic() - ended:.2f} s")
