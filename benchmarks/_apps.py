"""ASGI apps the gateway benchmark serves (each in its own uvicorn process).

backend      an instant OpenAI-compatible chat server (JSON, or SSE with ?chunks=N tokens)
bare         the same chat app, served directly (baseline for the middleware)
wrapped      the same chat app behind MeshRouteMiddleware in annotate mode
passthrough  a bare aiohttp pass-through proxy to BACKEND_URL (baseline for the gateway)
measuring_passthrough  the same, also parsing the request and counting the answer's tokens
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import aiohttp
from starlette.types import Message, Receive, Scope, Send

from meshroute_middleware.forwarding.measure import TokenMeter
from meshroute_middleware.http.request import parse_chat

BACKEND_URL = os.environ.get("BACKEND_URL", "http://127.0.0.1:1")
TOKENS = 16


async def _read(receive: Receive) -> bytes:
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            return body


def _completion(model: str) -> bytes:
    return json.dumps({
        "id": "c", "object": "chat.completion", "created": 0, "model": model,
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": "ok " * TOKENS}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": TOKENS,
                  "total_tokens": TOKENS + 3}}).encode()


def _chunk(model: str, i: int) -> bytes:
    data = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": model,
            "choices": [{"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}]}
    return b"data: " + json.dumps(data).encode() + b"\n\n"


async def chat(scope: Scope, receive: Receive, send: Send) -> None:
    """An instant chat server: what the middleware benchmark puts behind it."""
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    payload = json.loads(await _read(receive) or b"{}")
    model = payload.get("model", "m")
    if not payload.get("stream"):
        body = _completion(model)
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream")]})
    for i in range(int(payload.get("max_tokens", 64))):
        await send({"type": "http.response.body", "body": _chunk(model, i), "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


CPU_WORK_S = 0.001  # a small real server spends at least this per request (tokenize, template)


async def chat_cpu(scope: Scope, receive: Receive, send: Send) -> None:
    """The instant chat app plus 1 ms of CPU work per request."""
    if scope["type"] == "http":
        end = time.perf_counter() + CPU_WORK_S
        while time.perf_counter() < end:
            pass
    await chat(scope, receive, send)


SLOW_S = 0.02  # a head that takes 20 ms per answer (still far faster than any real LLM)


async def chat_slow(scope: Scope, receive: Receive, send: Send) -> None:
    """The chat app answering after 20 ms of waiting (not of CPU): a realistic head's shape."""
    if scope["type"] == "http":
        await asyncio.sleep(SLOW_S)
    await chat(scope, receive, send)


def wrapped() -> Any:
    """The instant chat app behind MeshRouteMiddleware (annotate mode)."""
    return _wrap(chat)


def wrapped_cpu() -> Any:
    """The 1 ms chat app behind MeshRouteMiddleware (annotate mode)."""
    return _wrap(chat_cpu)


def _wrap(app: Any) -> Any:
    """`app` behind MeshRouteMiddleware in annotate mode: the app serves, we route+measure."""
    from meshroute_middleware.core import parse_node
    from meshroute_middleware.middleware import (
        MeshRouteMiddleware,
        MiddlewareConfig,
        build_router,
    )

    mw = MeshRouteMiddleware(app, MiddlewareConfig(mode="annotate"), router=build_router(seed=1))
    for i in range(4):
        mw.router.upsert_node(parse_node({
            "node_id": f"n{i}", "model": "m", "start": 0, "end": 39, "layers": 40,
            "url": "http://127.0.0.1:9", "tps": 10 + i}))
    return mw


class PassThrough:
    """The simplest honest aiohttp proxy: what the gateway must come close to.

    With `measure`, it also does what any learned router must besides choosing: parse the
    request to learn its model (with meshroute's own `parse_chat`), and time and count the
    answer's tokens (with its `TokenMeter`). Between that and the gateway lies the routing
    itself (choose, record, events, metrics, fallback)."""

    def __init__(self, measure: bool = False) -> None:
        self.session: aiohttp.ClientSession | None = None
        self.measure = measure
        self.last: tuple[str, int, float, float] | None = None  # what was measured last

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await chat(scope, receive, send)
            return
        if self.session is None:
            self.session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=0), auto_decompress=False)
        body = await _read(receive)
        model = parse_chat(body).model if self.measure else ""
        start = time.perf_counter()
        async with self.session.post(BACKEND_URL + scope["path"], data=body, headers={
                "content-type": "application/json"}) as resp:
            headers = [(k, v) for k, v in resp.raw_headers
                       if k.lower() not in (b"transfer-encoding", b"connection")]
            meter = (TokenMeter(streaming=resp.content_type == "text/event-stream")
                     if self.measure else None)
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": headers})
            first = None
            async for chunk in resp.content.iter_any():
                if meter is not None:
                    if first is None:
                        first = time.perf_counter()
                    meter.feed(chunk)
                message: Message = {"type": "http.response.body", "body": chunk,
                                    "more_body": True}
                await send(message)
            if meter is not None:
                self.last = (model, meter.completion_tokens, time.perf_counter() - start,
                             (first or start) - start)
            await send({"type": "http.response.body", "body": b""})


passthrough = PassThrough()
measuring_passthrough = PassThrough(measure=True)
