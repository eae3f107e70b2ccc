"""A chat server that calls a tool, for /v1/responses tests (not product code): as a mesh
node's head or as a provider's base URL.

Asked with `tools` and no tool result yet, it calls the first tool (its arguments, by default
`get_weather`'s, streamed in pieces); with a tool result last, it answers with that result
quoted; otherwise it greets.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

ARGUMENT_PIECES = ['{"ci', 'ty": "Pa', 'ris"}']


@dataclass
class ToolChat:
    """Answers chat completions; `status` other than 200 answers that error instead."""

    name: str = "up"
    status: int = 200
    break_after: int | None = None  # streaming: drop the connection after this many chunks
    # ... once this is set (by the test, when its client saw them: chunks sent just before
    # a reset can be lost with it)
    break_when: threading.Event | None = field(default=None, compare=False)
    seen: list[dict[str, Any]] = field(default_factory=list)  # each request's body
    arguments: list[str] = field(default_factory=lambda: list(ARGUMENT_PIECES))

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])

    def answer(self, body: dict[str, Any]) -> tuple[list[str], list[str] | None]:
        """The text pieces, or the tool call's argument pieces, it answers `body` with."""
        messages = body.get("messages", [])
        last = messages[-1] if messages else {}
        if last.get("role") == "tool":
            return [f"{self.name}: the tool said ", str(last.get("content"))], None
        if body.get("tools"):
            return [], self.arguments
        return ["hello ", "from ", self.name], None

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.seen.append(body)
        if self.status != 200:
            return JSONResponse({"error": {"message": f"{self.name} says {self.status}",
                                           "type": "server_error", "code": "x"}},
                                status_code=self.status)
        texts, arguments = self.answer(body)
        limit = body.get("max_tokens")
        finish = "tool_calls" if arguments else "stop"
        if isinstance(limit, int) and limit < len(texts):
            texts, finish = texts[:limit], "length"
        if body.get("stream"):
            return StreamingResponse(self._stream(body, texts, arguments, finish),
                                     media_type="text/event-stream")
        message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) or None}
        if arguments:
            message["tool_calls"] = [{"id": "call_1", "type": "function", "function": {
                "name": _tool(body), "arguments": "".join(arguments)}}]
        return JSONResponse({
            "id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}})

    async def _stream(self, body: dict[str, Any], texts: list[str],
                      arguments: list[str] | None, finish: str) -> AsyncIterator[bytes]:
        chunks: list[dict[str, Any]] = [{"role": "assistant", "content": ""}]
        chunks += [{"content": t} for t in texts]
        if arguments:
            chunks.append({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                                           "function": {"name": _tool(body),
                                                        "arguments": ""}}]})
            chunks += [{"tool_calls": [{"index": 0, "function": {"arguments": a}}]}
                       for a in arguments]
        for i, delta in enumerate(chunks):
            if self.break_after is not None and i == self.break_after:
                if self.break_when is not None:
                    await asyncio.to_thread(self.break_when.wait, 30)
                raise ConnectionResetError("scripted broken stream")
            yield _sse(body, {"index": 0, "delta": delta, "finish_reason": None})
        yield _sse(body, {"index": 0, "delta": {}, "finish_reason": finish})
        if (body.get("stream_options") or {}).get("include_usage"):
            yield b"data: " + json.dumps({
                "id": "c", "object": "chat.completion.chunk", "created": 0,
                "model": body["model"], "choices": [],
                "usage": {"prompt_tokens": 7, "completion_tokens": len(chunks) - 1,
                          "total_tokens": 6 + len(chunks)}}).encode() + b"\n\n"  # no role
        yield b"data: [DONE]\n\n"


def _sse(body: dict[str, Any], choice: dict[str, Any]) -> bytes:
    data = {"id": "c", "object": "chat.completion.chunk", "created": 0,
            "model": body["model"], "choices": [choice]}
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def _tool(body: dict[str, Any]) -> str:
    return str(body["tools"][0]["function"]["name"])
