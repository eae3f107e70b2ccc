"""Real llama.cpp servers behind real node agents and a real gateway (issue 31): returning
turns reach the server that holds their prefix, the agents announce the servers' slots, and a
server killed mid-stream costs that stream only."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from .conftest import Mesh, start_mesh

TURNS = 3
SYSTEM_WORDS = 60  # ~350 prompt tokens: a cold prefill costs seconds on one thread


def system_prompt(conversation: int) -> str:
    words = " ".join(f"rule{conversation}x{i}" for i in range(SYSTEM_WORDS))
    return f"You are assistant {conversation}. Follow these rules: {words}."


def turn(gateway: str, model: str, messages: list[dict[str, str]], session: str,
         max_tokens: int = 12) -> tuple[str, str, dict[str, Any]]:
    """One streamed turn through the gateway: (route, answer, the server's timings)."""
    # usage asked for: llama-server's timings ride on its usage chunk, which the gateway
    # keeps from a client that did not ask (chat/stream_usage.py)
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True,
            "temperature": 0, "stream_options": {"include_usage": True}}
    parts: list[str] = []
    timings: dict[str, Any] = {}
    with httpx.stream("POST", gateway + "/v1/chat/completions", json=body, timeout=180,
                      headers={"x-session-id": session}) as resp:
        assert resp.status_code == 200, resp.read()
        route = resp.headers["x-meshroute-route"]
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            doc = json.loads(line[6:])
            assert "error" not in doc, doc
            timings = doc.get("timings") or timings
            for choice in doc.get("choices") or []:
                parts.append((choice.get("delta") or {}).get("content") or "")
    return route, "".join(parts), timings


def conversation(mesh: Mesh, index: int) -> list[tuple[str, dict[str, Any]]]:
    messages = [{"role": "system", "content": system_prompt(index)},
                {"role": "user", "content": f"Question one of conversation {index}?"}]
    out: list[tuple[str, dict[str, Any]]] = []
    for number in range(TURNS):
        route, answer, timings = turn(mesh.gateway, mesh.model, messages, f"conv-{index}")
        out.append((route, timings))
        messages += [{"role": "assistant", "content": answer},
                     {"role": "user", "content": f"Question {number + 2}, please?"}]
    return out


def test_the_agents_announce_each_servers_slots(mesh: Mesh) -> None:
    nodes = mesh.nodes()
    for node_id, server in mesh.servers.items():
        assert nodes[node_id]["slots"] == server.parallel == len(server.get("/slots"))


def test_returning_turns_reach_their_warm_server(mesh: Mesh) -> None:
    with ThreadPoolExecutor(4) as pool:
        runs = list(pool.map(lambda i: conversation(mesh, i), range(4)))
    heads = {run[0][0] for run in runs}
    assert len(heads) == 2, f"the first turns used one server only: {heads}"
    for run in runs:
        first = run[0][0]
        assert [route for route, _ in run[1:]] == [first] * (TURNS - 1), run
        for _, timings in run[1:]:
            # the server's own word: most of the returning prompt came from its cache
            assert timings, "the server's timings did not reach the client"
            assert timings["cache_n"] > 4 * timings["prompt_n"], timings


def test_a_server_killed_mid_stream_costs_that_stream_only(tmp_path: Path) -> None:
    mesh = start_mesh(tmp_path)
    try:
        # not continued on the other server (tests/engines/test_failover.py does that)
        body = {"model": mesh.model, "max_tokens": 400, "stream": True, "temperature": 0,
                "messages": [{"role": "user", "content": "Count from 1 to 300, one per line."}],
                "meshroute": {"continue": False}}
        events: list[str] = []
        with httpx.stream("POST", mesh.gateway + "/v1/chat/completions", json=body,
                          timeout=180) as resp:
            assert resp.status_code == 200
            victim = resp.headers["x-meshroute-route"].split("|", 1)[1].split("[", 1)[0]
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    events.append(line)
                    if len(events) == 5:
                        mesh.servers[victim].kill()
        content = [e for e in events if '"content"' in e]
        assert len(content) >= 4  # what was relayed before the crash reached the client
        last = json.loads(events[-1][6:]) if events[-1] != "data: [DONE]" else {}
        assert "error" in last, events[-3:]  # the stream ends with an error event
        survivor = next(n for n in mesh.servers if n != victim)
        # the next requests are answered, by the server still alive
        for _ in range(3):
            got = httpx.post(mesh.gateway + "/v1/chat/completions", timeout=180, json={
                "model": mesh.model, "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}]})
            assert got.status_code == 200, got.text
            assert got.headers["x-meshroute-route"].split("|", 1)[1].startswith(survivor)
        # the gateway learned it: the dead server's route holds the failure
        routing = httpx.get(mesh.gateway + "/v1/routing", timeout=10).json()
        rows = {row["head"]: row for row in routing["models"][mesh.model]["candidates"]}
        assert rows[victim]["failures"] > 0 and rows[victim]["last_error"], rows[victim]
        assert rows[survivor]["failures"] == 0
    finally:
        mesh.close()


def test_full_slots_queue_at_the_server_not_fail(mesh: Mesh) -> None:
    """Six requests at once on two servers of two slots: each is answered."""
    def one(i: int) -> tuple[int, str]:
        got = httpx.post(mesh.gateway + "/v1/chat/completions", timeout=180, json={
            "model": mesh.model, "max_tokens": 24, "temperature": 0,
            "messages": [{"role": "user", "content": f"Say something about {i}."}]})
        return got.status_code, got.headers.get("x-meshroute-route", "")
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(6)))
    assert [status for status, _ in results] == [200] * 6
    assert len({route for _, route in results}) == 2  # both servers took a share
