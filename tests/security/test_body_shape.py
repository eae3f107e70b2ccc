"""Bounded before expensive (issue 32, row 8), in process: a body past a shape limit (messages,
content parts, values) is a 413 with its own code on every API path, in that API's error
shape, and nothing is forwarded; the limits come from the settings table; what ordinary
clients send (a long agent history, multi-MB images) passes whole."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest

from ..chat.test_forward import Mesh, assert_openai_error, node
from ..upstream import FakeChat

pytestmark = pytest.mark.anyio
LIMITS = {"max_messages": 50, "max_content_parts": 80, "max_json_values": 5_000}


def many(n: int, content: Any = "x") -> list[dict[str, Any]]:
    return [{"role": "user", "content": content} for _ in range(n)]


# (path, body, code): each body past one limit of LIMITS
CASES = [
    ("/v1/chat/completions", {"model": "m", "messages": many(51)}, "too_many_messages"),
    ("/v1/chat/completions",
     {"model": "m", "messages": many(9, [{"type": "text", "text": "x"}] * 9)},
     "too_many_content_parts"),
    ("/v1/chat/completions", {"model": "m", "messages": many(1), "stop": list(range(6_000))},
     "too_many_values"),
    ("/v1/messages", {"model": "m", "max_tokens": 8, "messages": many(51)},
     "too_many_messages"),
    ("/v1/messages/count_tokens", {"model": "m", "messages": many(51)}, "too_many_messages"),
    ("/v1/responses", {"model": "m", "input": many(51)}, "too_many_messages"),
    ("/v1/embeddings", {"model": "m", "input": ["x"] * 6_000}, "too_many_values"),
]


@pytest.mark.parametrize(("path", "body", "code"), CASES)
async def test_a_body_past_a_shape_limit_is_413_in_its_apis_shape(
        path: str, body: dict[str, Any], code: str) -> None:
    head = FakeChat("a")
    mesh = Mesh({1: head}, **LIMITS)
    mesh.add(node("a", 0, 39, 1))
    async with mesh.client() as client:
        resp = await client.post(path, json=body)
    if path.startswith("/v1/messages"):  # Anthropic's error shape
        assert resp.status_code == 413, resp.text
        assert resp.json()["type"] == "error"
        assert set(resp.json()["error"]) == {"type", "message"}
    else:
        assert_openai_error(resp, 413, code)
    assert head.seen == []
    assert mesh.gateway.telemetry.rejected.get("http") == 1


async def test_just_under_the_limits_is_served() -> None:
    head = FakeChat("a")
    mesh = Mesh({1: head}, **LIMITS)
    mesh.add(node("a", 0, 39, 1))
    async with mesh.client() as client:
        resp = await client.post("/v1/chat/completions", json={
            "model": "m", "messages": many(50, [{"type": "text", "text": "x"}])})
    assert resp.status_code == 200, resp.text
    assert len(head.seen[0]["body"]["messages"]) == 50


def agent_history(turns: int) -> list[dict[str, Any]]:
    """A long agent session: each turn a tool call and its result (code, with commas and
    brackets inside strings)."""
    out: list[dict[str, Any]] = [{"role": "system", "content": "You are a coding agent."}]
    for i in range(turns):
        out.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": f"call_{i}", "type": "function", "function": {
                "name": "read_file", "arguments": json.dumps({"path": f"src/m{i}.py"})}}]})
        out.append({"role": "tool", "tool_call_id": f"call_{i}",
                    "content": "def f(x, y):\n    return {x: [y, y]}\n" * 20})
    return out


@pytest.mark.alone
async def test_what_ordinary_clients_send_passes_the_default_limits_whole() -> None:
    head = FakeChat("a")
    mesh = Mesh({1: head})
    mesh.add({**node("a", 0, 39, 1), "caps": ["vision", "tools"]})
    image = "data:image/png;base64," + base64.b64encode(os.urandom(3 * 1024 * 1024)).decode()
    history = agent_history(2_500)  # 5,001 messages, ~2.4 MiB
    looks = [{"role": "user", "content": [{"type": "text", "text": "what is this?"},
                                          {"type": "image_url", "image_url": {"url": image}}]}
             for _ in range(3)]  # ~12 MiB of images
    async with mesh.client() as client:
        for messages in (history, looks):
            resp = await client.post("/v1/chat/completions",
                                     json={"model": "m", "messages": messages})
            assert resp.status_code == 200, resp.text
    assert [len(s["body"]["messages"]) for s in head.seen] == [5_001, 3]
    assert head.seen[0]["body"]["messages"] == history
    assert head.seen[1]["body"]["messages"][2]["content"][1]["image_url"]["url"] == image
