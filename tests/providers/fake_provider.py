"""A scriptable OpenAI-compatible provider on 127.0.0.1 for provider-route tests (not product).

Each request (chat, completions or embeddings) takes the next `Reply` of the script (then
`by_key[key]`, then `default`) and is logged as a `Seen`: the bearer key, the model and the
path it carried. Replies: 200 (streamed or not,
with `usage`), any error status (429 with `Retry-After`, 5xx, 400), a slow first byte, and a
stream that breaks after some chunks.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import threading
import time
import urllib.parse
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from node_agent.embeddings import vector
from tests.providers.tool_calls import calls_tool, tool_answer
from tests.upstream import ServerThread


@dataclass(frozen=True)
class Reply:
    """What the fake answers to one request."""

    status: int = 200
    tokens: int = 8  # completion tokens (one streamed chunk each)
    prompt_tokens: int = 5
    ttfb_s: float = 0.0  # wait this long before answering at all
    token_delay_s: float = 0.0
    retry_after: str | None = None  # Retry-After header of an error answer
    break_after: int | None = None  # streaming: drop the connection after this many chunks
    # streaming: wait for this event (set by the test once its client saw content) before
    # dropping the connection, so the chunks sent are not lost with the reset
    break_when: threading.Event | None = field(default=None, compare=False)
    usage: bool = True  # include `usage` (in the last stream chunk when streaming)
    message: str | None = None  # an error answer's message, when not the default one
    echo_key: bool = False  # an error answer quotes the key it got (some providers do)
    # how an echoed key is written: "raw", "json" (`/` as `\/`), "url" (percent-encoded)
    echo_form: str = "raw"
    echo_header: bool = False  # `x-request-id` quotes the key (on any answer)
    echo_content: bool = False  # a 200's content quotes it (streamed: split across chunks)
    # the answer's content-encoding: "gzip" compresses it; any other is only its label
    encoding: str = ""
    role_first: bool = False  # streaming: a role-only chunk (no content) before the tokens
    # streaming: usage as OpenAI sends it, only when the request asks for it
    # (`stream_options.include_usage`): `"usage": null` in every chunk, the counts in a last
    # chunk of their own (`"choices": []`)
    asked_usage: bool = False
    delta: str = "content"  # streaming: what each token is ("reasoning_content", "tool_calls")
    cached_tokens: int = 0  # of prompt_tokens, read from the cache: prompt_tokens_details

    @classmethod
    def ok(cls, tokens: int = 8, **kw: Any) -> Reply:
        return cls(200, tokens, **kw)

    @classmethod
    def rate_limited(cls, retry_after: str | None = "1") -> Reply:
        return cls(429, retry_after=retry_after)

    @classmethod
    def error(cls, status: int = 500) -> Reply:
        return cls(status)

    @classmethod
    def slow(cls, ttfb_s: float, tokens: int = 8) -> Reply:
        return cls(200, tokens, ttfb_s=ttfb_s)

    @classmethod
    def broken(cls, after: int = 2, tokens: int = 8) -> Reply:
        return cls(200, tokens, break_after=after)


@dataclass(frozen=True)
class Seen:
    """One request as the provider saw it."""

    key: str | None  # the bearer token, None when there was no `Authorization: Bearer`
    model: str | None
    stream: bool
    headers: dict[str, str]
    body: dict[str, Any]
    path: str = "/v1/chat/completions"


@dataclass
class FakeProvider:
    """An OpenAI-compatible provider whose answers a test scripts."""

    name: str = "fake"
    script: Sequence[Reply] = ()
    default: Reply = field(default_factory=Reply)
    by_key: dict[str, Reply] = field(default_factory=dict)  # a key's own default answer
    models: tuple[str, ...] = ("big-model",)
    seen: list[Seen] = field(default_factory=list)
    disconnected: int = 0
    dimensions: int = 8  # of /v1/embeddings' vectors

    def __post_init__(self) -> None:
        self._script: deque[Reply] = deque(self.script)
        self._lock = threading.Lock()
        self.base_url = ""

    def push(self, *replies: Reply) -> None:
        """Append replies to the script (for the next requests)."""
        with self._lock:
            self._script.extend(replies)

    @property
    def keys(self) -> list[str | None]:
        return [s.key for s in self.seen]

    def app(self) -> Starlette:
        return Starlette(routes=[
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/completions", self._completions, methods=["POST"]),
            Route("/v1/embeddings", self._embeddings, methods=["POST"]),
            Route("/v1/models", self._models, methods=["GET"]),
        ])

    @contextmanager
    def serve(self) -> Iterator[FakeProvider]:
        """Run on a free loopback port; `base_url` is `http://127.0.0.1:PORT/v1` meanwhile."""
        with ServerThread(self.app()) as server:
            self.base_url = f"{server.url}/v1"
            yield self

    def _next(self, key: str | None) -> Reply:
        with self._lock:
            if self._script:
                return self._script.popleft()
        return self.by_key.get(key or "", self.default)

    async def _models(self, request: Request) -> Response:
        return JSONResponse({"object": "list",
                             "data": [{"id": m, "object": "model"} for m in self.models]})

    async def _take(self, request: Request) -> tuple[dict[str, Any], Reply, str,
                                                     Response | None]:
        """Log the request and take its reply: (body, reply, echoed key, the answer when it
        is decided already: not JSON, the caller left, a scripted error, an unknown model)."""
        try:
            body = await request.json()
        except ValueError:
            return {}, self.default, "", _error(400, "the body is not JSON",
                                                "invalid_request_error")
        auth = request.headers.get("authorization", "")
        key = auth[7:] if auth.lower().startswith("bearer ") else None
        self.seen.append(Seen(key, body.get("model"), bool(body.get("stream")),
                              dict(request.headers), body, request.url.path))
        reply = self._next(key)
        echoed = _echoed(key or "", reply.echo_form)
        if reply.ttfb_s and not await self._wait(request, reply.ttfb_s):
            return body, reply, echoed, Response(status_code=499)
        extra = {"x-request-id": f"req-{echoed}"} if reply.echo_header else {}
        if reply.status != 200:
            headers = {"Retry-After": reply.retry_after} if reply.retry_after else {}
            quoted = f" (key {echoed})" if reply.echo_key else ""
            text = reply.message or f"{self.name} answers {reply.status}"
            error = _error(reply.status, f"{text}{quoted}",
                           "rate_limit_error" if reply.status == 429 else "server_error",
                           {**headers, **extra})
            return body, reply, echoed, _encoded(error, reply)
        if body.get("model") not in self.models:
            return body, reply, echoed, _error(
                404, f"{self.name} has no model {body.get('model')!r}", "invalid_request_error")
        return body, reply, echoed, None

    async def _chat(self, request: Request) -> Response:
        body, reply, echoed, decided = await self._take(request)
        if decided is not None:
            return decided
        if calls_tool(body):
            return tool_answer(self.name, body)
        stream = bool(body.get("stream"))
        extra = {"x-request-id": f"req-{echoed}"} if reply.echo_header else {}
        if stream:
            return StreamingResponse(self._stream(body, reply, echoed),
                                     media_type="text/event-stream", headers=extra)
        await asyncio.sleep(reply.token_delay_s * reply.tokens)
        completion = self._completion(body, reply)
        if reply.echo_content:
            completion["choices"][0]["message"]["content"] += f" your key: {echoed}"
        return _encoded(JSONResponse(completion, headers=extra), reply)

    async def _embeddings(self, request: Request) -> Response:
        """Deterministic vectors (the emulator's), `Reply.prompt_tokens` as usage."""
        body, reply, _, decided = await self._take(request)
        if decided is not None:
            return decided
        raw = body.get("input")
        inputs = [raw] if isinstance(raw, str) or (
            isinstance(raw, list) and raw and isinstance(raw[0], int)) else list(raw or [])
        await asyncio.sleep(reply.token_delay_s * len(inputs))
        data = [{"object": "embedding", "index": i, "embedding": vector(item, self.dimensions)}
                for i, item in enumerate(inputs)]
        return JSONResponse({"object": "list", "data": data, "model": body.get("model"),
                             "usage": {"prompt_tokens": reply.prompt_tokens,
                                       "total_tokens": reply.prompt_tokens}})

    async def _completions(self, request: Request) -> Response:
        """text_completion answers: `Reply.tokens` texts `t0 `, `t1 `, ..., streamed or not."""
        body, reply, _, decided = await self._take(request)
        if decided is not None:
            return decided
        if body.get("stream"):
            return StreamingResponse(self._text_stream(body, reply),
                                     media_type="text/event-stream")
        await asyncio.sleep(reply.token_delay_s * reply.tokens)
        out: dict[str, Any] = {
            "id": f"cmpl-{self.name}", "object": "text_completion", "created": 0,
            "model": body.get("model"),
            "choices": [{"index": 0, "text": "".join(f"t{i} " for i in range(reply.tokens)),
                         "logprobs": None, "finish_reason": "stop"}]}
        if reply.usage:
            out["usage"] = _usage(reply)
        return JSONResponse(out)

    async def _text_stream(self, body: dict[str, Any], reply: Reply) -> AsyncIterator[bytes]:
        def event(text: str, finish: str | None) -> dict[str, Any]:
            return {"id": f"cmpl-{self.name}", "object": "text_completion", "created": 0,
                    "model": body.get("model"),
                    "choices": [{"index": 0, "text": text, "logprobs": None,
                                 "finish_reason": finish}]}
        for i in range(reply.tokens):
            if reply.break_after is not None and i == reply.break_after:
                raise ConnectionResetError("scripted broken stream")
            await asyncio.sleep(reply.token_delay_s)
            yield _sse(event(f"t{i} ", None))
        last = event("", "stop")
        if reply.usage:
            last["usage"] = _usage(reply)
        yield _sse(last)
        yield b"data: [DONE]\n\n"

    async def _wait(self, request: Request, seconds: float) -> bool:
        """Sleep `seconds`; False when the caller left meanwhile."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if await request.is_disconnected():
                self.disconnected += 1
                return False
            await asyncio.sleep(min(0.01, seconds))
        return True

    async def _stream(self, body: dict[str, Any], reply: Reply,
                      echoed: str = "") -> AsyncIterator[bytes]:
        if reply.role_first:
            yield _sse(self._chunk(body, {"role": "assistant", "content": ""}, None))
        if reply.echo_content:  # the key split across two writes, apart in time
            event = _sse(self._chunk(body, {"content": f"your key: {echoed}"}, None))
            if reply.echo_form == "json":
                event = event.replace(b"/", b"\\/")
            cut = event.index(b"your key: ") + len(b"your key: ") + len(echoed) // 2
            yield event[:cut]
            await asyncio.sleep(0.2)
            yield event[cut:]
        options = body.get("stream_options")
        asked = isinstance(options, dict) and options.get("include_usage") is True
        openai_usage = reply.asked_usage and asked
        for i in range(reply.tokens):
            if reply.break_after is not None and i == reply.break_after:
                if reply.break_when is not None:
                    await asyncio.to_thread(reply.break_when.wait, 60)
                raise ConnectionResetError("scripted broken stream")
            await asyncio.sleep(reply.token_delay_s)
            chunk = self._chunk(body, _delta(reply.delta, i), None)
            yield _sse({**chunk, "usage": None} if openai_usage else chunk)
        last = self._chunk(body, {}, "stop")
        if reply.asked_usage:
            if openai_usage:
                yield _sse({**last, "usage": None})
                last = {**last, "choices": [], "usage": _usage(reply)}
        elif reply.usage:
            last["usage"] = _usage(reply)
        yield _sse(last)
        yield b"data: [DONE]\n\n"

    def _chunk(self, body: dict[str, Any], delta: dict[str, Any],
               finish: str | None) -> dict[str, Any]:
        return {"id": f"chatcmpl-{self.name}", "object": "chat.completion.chunk", "created": 0,
                "model": body.get("model"),
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    def _completion(self, body: dict[str, Any], reply: Reply) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": f"chatcmpl-{self.name}", "object": "chat.completion", "created": 0,
            "model": body.get("model"),
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant",
                                     "content": " ".join(f"t{i}" for i in range(reply.tokens))}}]}
        if reply.usage:
            out["usage"] = _usage(reply)
        return out


def _delta(kind: str, i: int) -> dict[str, Any]:
    """The delta of the stream's `i`-th token: content, reasoning or a tool call's arguments."""
    if kind == "tool_calls":
        call: dict[str, Any] = {"index": 0, "function": {"arguments": f"a{i}"}}
        if i == 0:
            call.update(id="call_0", type="function")
            call["function"]["name"] = "lookup"
        return {"tool_calls": [call]}
    return {kind: f"t{i} "}


def _usage(reply: Reply) -> dict[str, Any]:
    out: dict[str, Any] = {"prompt_tokens": reply.prompt_tokens,
                           "completion_tokens": reply.tokens,
                           "total_tokens": reply.prompt_tokens + reply.tokens}
    if reply.cached_tokens:  # as OpenAI reports a prompt cache hit
        out["prompt_tokens_details"] = {"cached_tokens": reply.cached_tokens}
    return out


def _sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


def _echoed(key: str, form: str) -> str:
    """The key as an upstream might write it back."""
    if form == "url":
        return urllib.parse.quote(key, safe="")
    return key


def _encoded(response: Response, reply: Reply) -> Response:
    """The answer with the JSON-escaped form (`\\/`) and its encoding, as the reply says."""
    body = bytes(response.body)
    if reply.echo_form == "json":
        body = body.replace(b"/", b"\\/")  # still the same JSON (PHP's and Go's encoders)
    headers = {k: v for k, v in response.headers.items() if k != "content-length"}
    if reply.encoding:
        body = gzip.compress(body) if reply.encoding == "gzip" else body
        headers["content-encoding"] = reply.encoding
    return Response(body, response.status_code, headers=headers)


def _error(status: int, message: str, kind: str,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": str(status)}},
                        status_code=status, headers=headers)
