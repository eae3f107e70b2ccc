"""The answers the chat path gives before any route is chosen, on /v1/messages, at the ASGI
level: each in Anthropic's shape (a loop's 508, a slow body's 408), a request as Claude Code
sends it translated without a refusal, and annotate mode (the wrapped app serves the chat
request)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Message, Receive, Scope, Send

from meshroute_middleware.chat.dialects.anthropic import MESSAGES_PATH
from meshroute_middleware.core import parse_node
from meshroute_middleware.middleware import MeshRouteMiddleware, MiddlewareConfig


async def _unused_app(scope: Scope, receive: Receive, send: Send) -> None:
    raise AssertionError("the wrapped app is not reached")


def call(middleware: MeshRouteMiddleware, receive: Receive,
         headers: tuple[tuple[bytes, bytes], ...] = ()) -> list[Message]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": MESSAGES_PATH, "headers": list(headers),
             "query_string": b"beta=true"}
    asyncio.run(middleware(scope, receive, send))
    return sent


def answer(sent: list[Message]) -> tuple[int, dict[str, Any]]:
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return int(sent[0]["status"]), json.loads(body)


def body_of(payload: dict[str, Any]) -> Receive:
    async def receive() -> Message:
        return {"type": "http.request", "body": json.dumps(payload).encode(),
                "more_body": False}
    return receive


def test_a_forwarding_loop_is_refused_in_anthropic_shape() -> None:
    middleware = MeshRouteMiddleware(_unused_app, MiddlewareConfig(loop_marker="gw1"))
    sent = call(middleware, body_of({}), ((b"via", b"1.1 meshroute-gw1"),))
    status, body = answer(sent)
    assert status == 508
    assert body["type"] == "error" and body["error"]["type"] == "api_error"
    assert "forwarding loop" in body["error"]["message"]


def test_a_body_that_does_not_arrive_is_refused_in_anthropic_shape() -> None:
    async def stalled() -> Message:
        await asyncio.sleep(30)
        raise AssertionError("never")
    middleware = MeshRouteMiddleware(_unused_app, MiddlewareConfig(body_timeout_s=0.05))
    status, body = answer(call(middleware, stalled))
    assert status == 408
    assert body == {"type": "error", "error": {
        "type": "invalid_request_error",
        "message": "the request body did not arrive within 0.05 s"}}


CLAUDE_CODE = {  # the shape of a Claude Code turn (fields it sends that chat has no use for)
    "model": "claude-sonnet-4-5", "max_tokens": 32000, "stream": True,
    "system": [{"type": "text", "text": "You are Claude Code.",
                "cache_control": {"type": "ephemeral"}}],
    "messages": [{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>ctx</system-reminder>"},
        {"type": "text", "text": "fix the bug", "cache_control": {"type": "ephemeral"}}]}],
    "tools": [{"name": "Bash", "description": "run a command", "input_schema": {
        "type": "object", "properties": {"command": {"type": "string"}},
        "required": ["command"], "additionalProperties": False,
        "$schema": "http://json-schema.org/draft-07/schema#"}}],
    "metadata": {"user_id": "user_abc_account__session_1"},
    "temperature": 1, "thinking": {"type": "enabled", "budget_tokens": 1024},
}


def test_a_claude_code_turn_reaches_the_routing_step() -> None:
    middleware = MeshRouteMiddleware(_unused_app)  # no route knows the model: 404 after parse
    status, body = answer(call(middleware, body_of(CLAUDE_CODE), (
        (b"anthropic-version", b"2023-06-01"), (b"x-api-key", b"k"),
        (b"anthropic-beta", b"claude-code-20250219,interleaved-thinking-2025-05-14"))))
    assert status == 404  # translated and parsed: refused only for want of a route
    assert body["error"] == {"type": "not_found_error", "message":
                             "model 'claude-sonnet-4-5' is not served by any known route"}


def test_in_annotate_mode_the_app_serves_a_chat_request_and_the_client_gets_a_message() -> None:
    seen: list[dict[str, Any]] = []

    async def chat(request: Request) -> Response:
        seen.append({"path": request.url.path, "body": await request.json(),
                     "plan": request.headers.get("x-meshroute-plan")})
        return JSONResponse({"choices": [{"message": {"content": "served by the app"},
                                          "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 3, "completion_tokens": 4}})

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    middleware = MeshRouteMiddleware(app, MiddlewareConfig(mode="annotate"))
    middleware.router.upsert_node(parse_node({
        "node_id": "a", "model": "m", "start": 0, "end": 9, "layers": 10,
        "url": "http://127.0.0.1:1", "tps": 10.0}))

    async def run() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=middleware),
                                     base_url="http://t") as client:
            return await client.post(MESSAGES_PATH, json={
                "model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    resp = asyncio.run(run())
    assert resp.status_code == 200, resp.text
    assert resp.json()["content"] == [{"type": "text", "text": "served by the app"}]
    assert resp.json()["usage"] == {"input_tokens": 3, "output_tokens": 4}
    assert seen[0]["path"] == "/v1/chat/completions" and seen[0]["plan"]
    assert seen[0]["body"]["messages"] == [{"role": "user", "content": "hi"}]
