"""A tiny OpenAI-compatible chat server (stand-in for llama.cpp, vLLM, Ollama ...).

GET /v1/models and POST /v1/chat/completions (streaming or not); it answers with a few words at
a steady pace so that tokens/s mean something. With `--rate-limit N` it plays a provider with a
tight quota: past N chats in a `--window-s` window it answers 429 with `Retry-After`.

    .venv/bin/python examples/node_agent/stub_server.py --port 8001 --model tiny
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncIterator

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

WORDS = ["the", "mesh", "routes", "every", "request", "to", "the", "chain", "that",
         "answers", "fastest"]


def build(model: str, tokens_per_s: float, rate_limit: int = 0,
          window_s: float = 10.0) -> Starlette:
    """The server's app (`rate_limit` 0: no limit)."""
    recent: list[float] = []

    def limited() -> JSONResponse | None:
        now = time.monotonic()
        recent[:] = [t for t in recent if now - t < window_s]
        if rate_limit and len(recent) >= rate_limit:
            retry = max(1, round(window_s - (now - recent[0])))
            return JSONResponse({"error": {"message": "rate limit exceeded", "type":
                                           "rate_limit_error", "code": "rate_limited"}},
                                status_code=429, headers={"retry-after": str(retry)})
        recent.append(now)
        return None

    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": model, "object": "model"}]})

    async def chat(request: Request) -> Response:
        refused = limited()
        if refused is not None:
            return refused
        body = await request.json()
        n = int(body.get("max_tokens") or 16)
        words = [WORDS[i % len(WORDS)] + " " for i in range(n)]
        usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
        if not body.get("stream"):
            await asyncio.sleep(n / tokens_per_s)
            return JSONResponse({
                "id": "chatcmpl-stub", "object": "chat.completion", "created": int(time.time()),
                "model": model, "usage": usage,
                "choices": [{"index": 0, "finish_reason": "length",
                             "message": {"role": "assistant", "content": "".join(words)}}]})

        async def events() -> AsyncIterator[bytes]:
            for word in words:
                await asyncio.sleep(1 / tokens_per_s)
                chunk = {"id": "chatcmpl-stub", "object": "chat.completion.chunk",
                         "model": model, "choices": [{"index": 0, "delta": {"content": word}}]}
                yield f"data: {json.dumps(chunk)}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/models", models, methods=["GET"]),
                             Route("/v1/chat/completions", chat, methods=["POST"])])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8001)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--tps", type=float, default=200.0, help="tokens per second")
    parser.add_argument("--rate-limit", type=int, default=0, help="chats per window (0: any)")
    parser.add_argument("--window-s", type=float, default=10.0)
    args = parser.parse_args()
    uvicorn.run(build(args.model, args.tps, args.rate_limit, args.window_s), host="127.0.0.1",
                port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
