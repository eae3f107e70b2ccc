"""A scriptable OpenAI-compatible chat server for gateway tests (not product code)."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class FakeChat:
    """Answers chat completions with `tokens` tokens, `token_delay_s` apart; knobs for faults."""

    name: str = "up"
    tokens: int = 16
    token_delay_s: float = 0.0
    status: int = 200  # answer this status (with an error body) instead of a completion
    header_delay_s: float = 0.0  # wait before answering at all (timeouts)
    die_after: int | None = None  # streaming: drop the connection after this many tokens
    usage_in_stream: bool = False
    seen: list[dict[str, Any]] = field(default_factory=list)  # headers + body of each request
    cancelled: int = 0
    extra_headers: dict[str, str] = field(default_factory=dict)  # sent with every answer
    max_tokens_limit: int | None = None  # refuse a larger max_tokens as vLLM does (400)
    # streaming: after this many tokens, hold the rest until `released` is set (a stream kept
    # in flight for as long as a test needs it, not for a fixed time)
    hold_after: int | None = None
    released: threading.Event = field(default_factory=threading.Event)

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
        ])

    async def models(self, request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.seen.append({"headers": dict(request.headers), "body": body})
        if self.header_delay_s:  # thinking before the first byte; notices a caller leaving
            deadline = time.monotonic() + self.header_delay_s
            while time.monotonic() < deadline:
                if await request.is_disconnected():
                    self.cancelled += 1
                    return Response(status_code=499)
                await asyncio.sleep(0.01)
        asked = body.get("max_tokens")
        if self.max_tokens_limit is not None and isinstance(asked, int) \
                and asked > self.max_tokens_limit:
            return JSONResponse({"error": {
                "message": f"max_tokens must be at least 1 and at most "
                           f"{self.max_tokens_limit}, got {asked}.",
                "type": "BadRequestError", "param": None, "code": 400}}, status_code=400)
        if self.status != 200:
            return JSONResponse({"error": {"message": f"{self.name} says {self.status}",
                                           "type": "server_error", "code": "x"}},
                                status_code=self.status, headers=self.extra_headers)
        if body.get("stream"):
            return StreamingResponse(self._stream(body), media_type="text/event-stream")
        for _ in range(self.tokens):
            await asyncio.sleep(self.token_delay_s)
        return JSONResponse(_completion(self.name, body, self.tokens),
                            headers=self.extra_headers)

    async def _stream(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        try:
            for i in range(self.tokens):
                if self.die_after is not None and i == self.die_after:
                    raise ConnectionError("emulated death mid-stream")
                if i == self.hold_after:
                    while not self.released.is_set():
                        await asyncio.sleep(0.01)
                await asyncio.sleep(self.token_delay_s)
                yield _chunk(self.name, body, {"content": f"t{i} "})
            yield _chunk(self.name, body, {}, finish="stop")
            if self.usage_in_stream:
                usage = {"id": "c", "object": "chat.completion.chunk", "created": 0,
                         "model": body["model"], "choices": [],
                         "usage": {"prompt_tokens": 3, "completion_tokens": self.tokens,
                                   "total_tokens": self.tokens + 3}}
                yield b"data: " + json.dumps(usage).encode() + b"\n\n"
            yield b"data: [DONE]\n\n"
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def _chunk(name: str, body: dict[str, Any], delta: dict[str, Any],
           finish: str | None = None) -> bytes:
    data = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def _completion(name: str, body: dict[str, Any], tokens: int) -> dict[str, Any]:
    return {"id": "c", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"from {name}"}}],
            "usage": {"prompt_tokens": 3, "completion_tokens": tokens,
                      "total_tokens": tokens + 3}}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerThread:
    """Runs an ASGI app with real uvicorn on a loopback port in a background thread."""

    def __init__(self, app: Any, port: int | None = None) -> None:
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                lifespan="on")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@contextmanager
def heads_elsewhere(code: str) -> Iterator[Any]:
    """Run `code` (heads on real uvicorn, e.g. FakeChat apps in ServerThreads) in a process of
    its own, so a test's gc counts see only the gateway's objects; yield the JSON it prints
    first (its URLs); closing its stdin is its cue to exit."""
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    assert proc.stdout is not None and proc.stdin is not None
    try:
        yield json.loads(proc.stdout.readline())
    finally:
        proc.stdin.close()
        proc.wait(15)


SERVE_PATIENCE_S = 90.0  # for `meshroute serve` to start: >30 s at load 30 on 2 cores (2026-12-07)


@contextmanager
def serve_process(flags: Sequence[str], log: Path, env: Mapping[str, str] | None = None,
                  ) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """`meshroute serve --port P --no-mdns FLAGS` as a process of its own, its output in `log`
    (and `env` over this one's); yields its URL and the process once /healthz answers 200, and
    kills it when the block ends (SIGKILL: only what it saved survives)."""
    port = free_port()
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "meshroute_middleware.app.cli", "serve", "--port", str(port),
             "--no-mdns", *flags], stdout=out, stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVE_PATIENCE_S
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "meshroute serve did not start"
            time.sleep(0.05)
        yield url, proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
