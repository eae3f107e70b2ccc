"""A fake Anthropic Messages provider on 127.0.0.1 (test helper, not product).

Serves `POST /v1/messages` as Anthropic does: a `message`, or its SSE events when streamed;
`status` answers that error instead (Anthropic's error shape). Each request is kept in `seen`
(headers and body), so a test can check what reached it untranslated. Offered tools, and not
answering a tool's result, it calls the first tool (its required arguments "mesh").
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.upstream import ServerThread


@dataclass
class FakeAnthropic:
    """Answers Messages requests with `text`, `output_tokens` counted in its usage."""

    text: str = "hello from claude"
    input_tokens: int = 12
    output_tokens: int = 4
    status: int = 200
    # the prompt's tokens read from / written to the cache, reported beside input_tokens
    # (as Anthropic does) when either is set
    cache_read: int = 0
    cache_write: int = 0
    seen: list[dict[str, Any]] = field(default_factory=list)
    base_url: str = ""

    def app(self) -> Starlette:
        return Starlette(routes=[Route("/v1/messages", self._messages, methods=["POST"])])

    @contextmanager
    def serve(self) -> Iterator[FakeAnthropic]:
        """Run on a free loopback port; `base_url` is `http://127.0.0.1:PORT/v1` meanwhile."""
        with ServerThread(self.app()) as server:
            self.base_url = f"{server.url}/v1"
            yield self

    async def _messages(self, request: Request) -> Response:
        body = await request.json()
        self.seen.append({"headers": dict(request.headers), "body": body})
        if self.status != 200:
            return JSONResponse({"type": "error", "error": {
                "type": "overloaded_error", "message": "fake anthropic is overloaded"}},
                status_code=self.status)
        call = _tool_use(body)
        message = {"id": "msg_fake", "type": "message", "role": "assistant",
                   "model": body["model"],
                   "content": [{"type": "text", "text": self.text}] if call is None else [call],
                   "stop_reason": "end_turn" if call is None else "tool_use",
                   "stop_sequence": None,
                   "usage": {**self._input(), "output_tokens": self.output_tokens}}
        if body.get("stream"):
            return StreamingResponse(self._events(message), media_type="text/event-stream")
        return JSONResponse(message)

    def _input(self) -> dict[str, int]:
        usage = {"input_tokens": self.input_tokens}
        if self.cache_read or self.cache_write:
            usage.update(cache_read_input_tokens=self.cache_read,
                         cache_creation_input_tokens=self.cache_write)
        return usage

    def _events(self, message: dict[str, Any]) -> Iterator[bytes]:
        start = {**message, "content": [], "stop_reason": None,
                 "usage": {**self._input(), "output_tokens": 1}}
        yield _event("message_start", {"type": "message_start", "message": start})
        block = message["content"][0]
        opened = {**block, "input": {}} if block["type"] == "tool_use" else {"type": "text",
                                                                               "text": ""}
        yield _event("content_block_start", {"type": "content_block_start", "index": 0,
                                             "content_block": opened})
        deltas = ([{"type": "input_json_delta", "partial_json": json.dumps(block["input"])}]
                  if block["type"] == "tool_use" else
                  [{"type": "text_delta", "text": w + " "} for w in self.text.split(" ")])
        for delta in deltas:
            yield _event("content_block_delta", {"type": "content_block_delta", "index": 0,
                                                 "delta": delta})
        yield _event("content_block_stop", {"type": "content_block_stop", "index": 0})
        yield _event("message_delta", {"type": "message_delta",
                                       "delta": {"stop_reason": message["stop_reason"],
                                                 "stop_sequence": None},
                                       "usage": {"output_tokens": self.output_tokens}})
        yield _event("message_stop", {"type": "message_stop"})


def _tool_use(body: dict[str, Any]) -> dict[str, Any] | None:
    """The tool_use block the fake answers with, or None (text)."""
    last = body["messages"][-1]["content"]
    answered = isinstance(last, list) and any(b.get("type") == "tool_result" for b in last)
    if not body.get("tools") or answered:
        return None
    tool = body["tools"][0]
    required = tool.get("input_schema", {}).get("required", [])
    return {"type": "tool_use", "id": "toolu_fake", "name": tool["name"],
            "input": {k: "mesh" for k in required}}


def _event(name: str, data: dict[str, Any]) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data)}\n\n".encode()
