"""The fake provider's answer to a request that offers tools (test helper, not product).

Kept apart from the fake's other answers: when the request has `tools` and its last message is
no tool's result, the answer calls the first tool (its required arguments "mesh"), streamed or
not; after a tool's result the fake answers text as usual.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from starlette.responses import JSONResponse, Response, StreamingResponse


def calls_tool(body: dict[str, Any]) -> bool:
    """Whether the fake answers `body` with a tool call."""
    messages = body.get("messages") or [{}]
    return bool(body.get("tools")) and messages[-1].get("role") != "tool"


def tool_answer(name: str, body: dict[str, Any]) -> Response:
    """A chat completion (or its stream) calling the request's first tool."""
    function = body["tools"][0]["function"]
    required = function.get("parameters", {}).get("required", [])
    call = {"id": f"call_{name}", "type": "function",
            "function": {"name": function["name"],
                         "arguments": json.dumps({k: "mesh" for k in required})}}
    usage = {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}
    if not body.get("stream"):
        return JSONResponse({
            "id": f"chatcmpl-{name}", "object": "chat.completion", "created": 0,
            "model": body.get("model"), "usage": usage,
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": None, "tool_calls": [call]}}]})
    return StreamingResponse(_chunks(name, body, call, usage), media_type="text/event-stream")


def _chunks(name: str, body: dict[str, Any], call: dict[str, Any],
            usage: dict[str, int]) -> Iterator[bytes]:
    arguments = call["function"]["arguments"]
    half = len(arguments) // 2
    deltas: list[tuple[dict[str, Any], str | None]] = [
        ({"role": "assistant", "tool_calls": [{**call, "index": 0, "function": {
            "name": call["function"]["name"], "arguments": ""}}]}, None),
        ({"tool_calls": [{"index": 0, "function": {"arguments": arguments[:half]}}]}, None),
        ({"tool_calls": [{"index": 0, "function": {"arguments": arguments[half:]}}]}, None),
        ({}, "tool_calls")]
    for delta, finish in deltas:
        yield _sse({"id": f"chatcmpl-{name}", "object": "chat.completion.chunk",
                    "model": body.get("model"),
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
    yield _sse({"id": f"chatcmpl-{name}", "object": "chat.completion.chunk", "choices": [],
                "usage": usage})
    yield b"data: [DONE]\n\n"


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"
