"""An emulated shard node: an OpenAI-compatible Starlette app whose plan really crosses hops."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
import anyio
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from meshroute_middleware.core.contracts.cache import CACHE_HEADER, cache_note, encode_cache
from meshroute_middleware.core.contracts.error_body import error_object
from meshroute_middleware.core.contracts.load import LOAD_HEADER
from meshroute_middleware.core.prefix import Prefix

from .chat import (
    ChatJob,
    ChatRequestError,
    parse_chat,
    tool_chunks,
    tool_completion,
    usage_chunk,
    words,
)
from .completions import CHAT, COMPLETIONS, Shape, parse_completion
from .embeddings import embeddings_answer, parse_embeddings
from .hops import (
    HANDSHAKE,
    HOP_PATH,
    PLAN_HEADER,
    PROMPT_HEADER,
    ROUTE_HEADER,
    HopLink,
    HopOpener,
    PlanHop,
    decode_prompt,
    parse_plan,
)
from .serving import serve_app
from .shard import EmulatorConfig, EmulatorError, InjectedFault, ShardWorker, TokenTimer

__all__ = ["EmulatedNode", "EmulatorConfig", "serve_node"]

MAX_BODY_BYTES = 1024 * 1024
log = logging.getLogger("meshroute.emulator")


class _Died(EmulatorError):
    """The node dies mid-request: once the response has started the connection just drops
    (the handler returns without finishing it), before that the client gets a 500."""


def error_response(exc: EmulatorError) -> JSONResponse:
    """An OpenAI-style JSON error for an emulator error."""
    body = error_object(str(exc), type(exc).__name__, exc.kind, param=None)
    return JSONResponse(body, status_code=exc.status)


class _Sender:
    """Wraps ASGI send; remembers whether the response has started."""

    def __init__(self, send: Send) -> None:
        self._send, self.started = send, False

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        await self._send({"type": "http.response.start", "status": status, "headers": headers})

    async def body(self, data: bytes, more: bool = True) -> None:
        await self._send({"type": "http.response.body", "body": data, "more_body": more})


class EmulatedNode:
    """One emulated node: its worker (slots, speed, faults) and its ASGI app."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self.worker = ShardWorker(config)
        self._opener: HopOpener | None = None
        self._served = 0

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a slot (what the agent announces as `queue`)."""
        return self.worker.queue_depth

    @property
    def measured_tps(self) -> float:
        """Measured tokens/s of this node's shard (what the agent announces as `tps`)."""
        return self.worker.measured_tps

    def app(self) -> Starlette:
        """The Starlette app: chat completions, completions, embeddings, models, the internal
        hop, status."""
        routes = [
            Route("/v1/chat/completions", _AsgiEndpoint(self.chat), methods=["POST"]),
            Route("/v1/completions", _AsgiEndpoint(self.completions), methods=["POST"]),
            Route("/v1/embeddings", _AsgiEndpoint(self.embeddings), methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route(HOP_PATH, _AsgiEndpoint(self.hop), methods=["POST"]),
            Route("/internal/status", self.status, methods=["GET"]),
        ]
        return Starlette(routes=routes, lifespan=self._lifespan)

    @asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            self._opener = HopOpener(session)
            yield
            self._opener = None

    async def models(self, request: Request) -> JSONResponse:
        """GET /v1/models: the one model this node serves a shard of."""
        data = [{"id": self.config.model, "object": "model", "created": 0,
                 "owned_by": "meshroute-emulator"}]
        return JSONResponse({"object": "list", "data": data})

    async def status(self, request: Request) -> JSONResponse:
        """GET /internal/status: load and measured speed."""
        w = self.worker
        return JSONResponse({"node_id": self.config.node_id, "queue": w.queue_depth,
                             "running": w.running, "tps": w.measured_tps,
                             "tokens_total": w.tokens_total, "requests_total": w.requests_total})

    # -- the chain to the next hop -----------------------------------------------------
    @asynccontextmanager
    async def _chain(self, plan: list[PlanHop], route: str | None,
                     prompt: Prefix | None = None) -> AsyncIterator[HopLink | None]:
        if len(plan) == 1:
            yield None
            return
        assert self._opener is not None, "app lifespan not started"
        link, close = await self._opener.open(plan[1:], route, prompt)
        try:
            yield link
        finally:
            await close()

    async def _tokens(self, plan: list[PlanHop], link: HopLink | None, n: int,
                      fault: str | None, prefill_s: float = 0.0) -> AsyncIterator[str]:
        timer = TokenTimer(self.worker, plan[0].span, self.worker.noise())
        for index, word in enumerate(words(n)):
            if index == 0 and prefill_s > 0:  # the prompt's uncached part, before any token
                await anyio.sleep(prefill_s)
            if fault == "stall" and index == 0:
                await anyio.sleep(self.config.stall_s)
            if fault == "die" and index == max(n // 2, 1):
                raise _Died(f"node {self.config.node_id} died mid-stream (fault)")
            await timer.step()
            if link is not None:
                await link.step(index)
            yield word

    # -- POST /v1/chat/completions -----------------------------------------------------
    async def chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The OpenAI-compatible chat endpoint; the head of the request's plan."""
        await self._generate(scope, receive, send, parse_chat, CHAT)

    async def completions(self, scope: Scope, receive: Receive, send: Send) -> None:
        """POST /v1/completions: generated as chat is, answered as `text_completion`."""
        await self._generate(scope, receive, send, parse_completion, COMPLETIONS)

    async def _generate(self, scope: Scope, receive: Receive, send: Send,
                        parse: Callable[[Any, EmulatorConfig], ChatJob], shape: Shape) -> None:
        """Parse, then run a generation request over its plan, answered in `shape`."""
        request = Request(scope, receive)
        try:
            job = parse(await _read_body(request), self.config)
            plan = parse_plan(request.headers.get(PLAN_HEADER), self.config, head=True)
        except EmulatorError as exc:
            await error_response(exc)(scope, receive, send)
            return
        out = _Sender(send)
        route = request.headers.get(ROUTE_HEADER)
        failure: EmulatorError | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(_cancel_on_disconnect, receive, tg.cancel_scope)
            try:
                await self._run_chat(job, plan, route, out, shape)
            except EmulatorError as exc:
                failure = exc
            tg.cancel_scope.cancel()
        await self._fail(failure, out, scope, receive, send)

    async def _run_chat(self, job: ChatJob, plan: list[PlanHop], route: str | None,
                        out: _Sender, shape: Shape = CHAT) -> None:
        async with self.worker.slot():
            fault = self.worker.fault()
            if fault == "fail":
                raise InjectedFault(f"node {self.config.node_id} failed the request (fault)")
            async with self._chain(plan, route, job.prompt) as link:
                self._served += 1
                ident = f"{shape.prefix}-{self.config.node_id}-{self._served}"
                note = self._cache_note(job)
                tokens = self._tokens(plan, link, job.max_tokens, fault,
                                      self.worker.prefill_s(job.prompt, plan[0].span))
                if job.tool is not None:
                    await self._tool_call(job, ident, tokens, out)
                elif job.stream:
                    await self._stream(job, ident, tokens, out, shape, note)
                else:
                    text = "".join([w async for w in tokens])
                    body = json.dumps(shape.whole(job, ident, text, int(time.time())))
                    await out.start(200, self._headers(b"application/json", note))
                    await out.body(body.encode(), more=False)
                self.worker.remember(job.prompt, "".join(words(job.max_tokens)))

    async def _stream(self, job: ChatJob, ident: str, tokens: AsyncIterator[str],
                      out: _Sender, shape: Shape = CHAT, note: bytes | None = None) -> None:
        created = int(time.time())
        await out.start(200, self._headers(b"text/event-stream", note))
        first = True
        async for word in tokens:
            await out.body(_sse(shape.token(job, ident, created, word, first)))
            first = False
        await out.body(_sse(shape.finish(job, ident, created)))
        if job.include_usage:
            await out.body(_sse(shape.usage(job, ident, created)))
        await out.body(b"data: [DONE]\n\n", more=False)

    async def _tool_call(self, job: ChatJob, ident: str, tokens: AsyncIterator[str],
                         out: _Sender) -> None:
        """Answer with `job.tool` once the tokens (the hops' work) are done."""
        async for _ in tokens:
            pass
        created = int(time.time())
        if not job.stream:
            body = json.dumps(tool_completion(job, ident, created)).encode()
            await out.start(200, self._headers(b"application/json"))
            await out.body(body, more=False)
            return
        await out.start(200, self._headers(b"text/event-stream"))
        for part in tool_chunks(job, ident, created):
            await out.body(_sse(part))
        if job.include_usage:
            await out.body(_sse(usage_chunk(job, ident, created)))
        await out.body(b"data: [DONE]\n\n", more=False)

    # -- POST /v1/embeddings -----------------------------------------------------------
    async def embeddings(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Deterministic vectors, one per input; each input is one pass over the plan's
        hops (a slot held on each), so inputs/s follows the node's speed and faults."""
        request = Request(scope, receive)
        try:
            job = parse_embeddings(await _read_body(request), self.config)
            plan = parse_plan(request.headers.get(PLAN_HEADER), self.config, head=True)
        except EmulatorError as exc:
            await error_response(exc)(scope, receive, send)
            return
        out = _Sender(send)
        failure: EmulatorError | None = None
        async with anyio.create_task_group() as tg:
            tg.start_soon(_cancel_on_disconnect, receive, tg.cancel_scope)
            try:
                async with self.worker.slot():
                    fault = self.worker.fault()
                    if fault == "fail":
                        raise InjectedFault(f"node {self.config.node_id} failed the request "
                                            "(fault)")
                    async with self._chain(plan, request.headers.get(ROUTE_HEADER)) as link:
                        async for _ in self._tokens(plan, link, len(job.inputs), fault):
                            pass  # a death before the answer starts is a 500
                        body = json.dumps(embeddings_answer(job)).encode()
                        await out.start(200, self._headers(b"application/json"))
                        await out.body(body, more=False)
            except EmulatorError as exc:
                failure = exc
            tg.cancel_scope.cancel()
        await self._fail(failure, out, scope, receive, send)

    def _cache_note(self, job: ChatJob) -> bytes | None:
        """The x-meshroute-cache value of this request on this (head) hop: how much of its
        prompt the cache holds before its prefill; None for a node without a cache."""
        if job.prompt is None or self.worker.cache is None:
            return None
        cached = self.worker.cached_tokens(job.prompt)
        return encode_cache(cache_note(cached, job.prompt.prompt_tokens)).encode()

    def _headers(self, content_type: bytes,
                 note: bytes | None = None) -> list[tuple[bytes, bytes]]:
        # No x-meshroute-route echo: the gateway sets that header on what the client sees.
        headers = [(b"content-type", content_type), (b"cache-control", b"no-cache"),
                   (b"x-meshroute-node", self.config.node_id.encode()),
                   # what it holds, this answer's request too (issue 31: several trackers
                   # see one node's load on every answer; core/node_load.py)
                   (LOAD_HEADER.encode(), str(self.worker.held).encode())]
        if note is not None:
            headers.append((CACHE_HEADER.encode(), note))
        return headers

    # -- POST /internal/hop ------------------------------------------------------------
    async def hop(self, scope: Scope, receive: Receive, send: Send) -> None:
        """A downstream hop: one line per token in, one line per finished token out."""
        request = Request(scope, receive)
        out = _Sender(send)
        try:
            plan = parse_plan(request.headers.get(PLAN_HEADER), self.config, head=False)
            prompt = decode_prompt(request.headers.get(PROMPT_HEADER))
            async with self.worker.slot():
                fault = self.worker.fault()
                if fault == "fail":
                    raise InjectedFault(f"node {self.config.node_id} failed the hop (fault)")
                async with self._chain(plan, request.headers.get(ROUTE_HEADER),
                                       prompt) as link:
                    await out.start(200, [(b"content-type", b"text/plain")])
                    count = await self._relay(receive, out, plan, link, fault,
                                              self.worker.prefill_s(prompt, plan[0].span))
                    self.worker.remember(prompt, "".join(words(count)))
        except EmulatorError as exc:
            await self._fail(exc, out, scope, receive, send)

    async def _fail(self, failure: EmulatorError | None, out: _Sender, scope: Scope,
                    receive: Receive, send: Send) -> None:
        """An error before the first byte is an OpenAI-style answer; after, a dropped line."""
        if failure is None:
            return
        if out.started:
            log.info("%s: dropping the connection: %s", self.config.node_id, failure)
            return  # uvicorn closes a response the app left unfinished
        await error_response(failure)(scope, receive, send)

    async def _relay(self, receive: Receive, out: _Sender, plan: list[PlanHop],
                     link: HopLink | None, fault: str | None, prefill_s: float = 0.0) -> int:
        """Run each token line through this hop; return how many ran."""
        timer = TokenTimer(self.worker, plan[0].span, self.worker.noise())
        count, buffer = 0, b""
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return count
            buffer += message.get("body", b"")
            if len(buffer) > 64:
                raise _Died("hop stream line too long")
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line == HANDSHAKE:
                    continue
                if count == 0 and prefill_s > 0:  # this hop's layers of the prompt
                    await anyio.sleep(prefill_s)
                if fault == "stall" and count == 0:
                    await anyio.sleep(self.config.stall_s)
                if fault == "die" and count == 1:
                    raise _Died(f"node {self.config.node_id} died mid-stream (fault)")
                await timer.step(self.config.hop_latency_s)
                if link is not None:
                    await link.step(count)
                await out.body(line + b"\n")
                count += 1
            if not message.get("more_body", False):
                await out.body(b"", more=False)
                return count


class _AsgiEndpoint:
    """Marks a coroutine as a raw ASGI app for Starlette's Route (not request/response)."""

    def __init__(self, handler: Callable[[Scope, Receive, Send], Awaitable[None]]) -> None:
        self._handler = handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._handler(scope, receive, send)


async def _read_body(request: Request) -> Any:
    body = b""
    async for part in request.stream():
        body += part
        if len(body) > MAX_BODY_BYTES:
            raise ChatRequestError(f"request body exceeds {MAX_BODY_BYTES} bytes")
    try:
        return json.loads(body)
    except ValueError:
        raise ChatRequestError("request body is not valid JSON") from None


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while True:
        message: MutableMapping[str, Any] = await receive()
        if message["type"] == "http.disconnect":
            scope.cancel()
            return


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


@asynccontextmanager
async def serve_node(config: EmulatorConfig, host: str = "127.0.0.1",
                     port: int = 0) -> AsyncIterator[tuple[EmulatedNode, str]]:
    """Serve an emulated node with uvicorn; yield the node and its base URL."""
    node = EmulatedNode(config)
    async with serve_app(node.app(), host, port) as url:
        yield node, url
