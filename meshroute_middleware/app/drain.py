"""Drain: the outermost ASGI wrapper of a served gateway, so that a stopping server lets the
streams in flight finish and is then held by none.

At shutdown (app/run.py, SIGTERM or Ctrl-C) `stop_accepting()` closes the routing event bus,
so event streams (/v1/routing/events, the dashboard's EventSource) end cleanly, and answers a
new chat request on a connection still open with a 503; `settle()` waits for the chat
requests in flight to finish, up to `--drain-timeout` (issue 33). What is still open then is
cut (`drain()`): every chat request still being served is cancelled, its attempts ended
without a record (the cut is ours: it says nothing of a route, chat/relay.py `cut_by_us`);
its client then gets, in place of the rest: a 503 JSON error when nothing was sent yet, the
SSE error event and the stream's end mid-stream, and a JSON answer already under way is cut
short without its final chunk (never passed off as complete). The other APIs' requests
(chat/dialects: /v1/responses, ...) are drained alike; their streams end with the same SSE
error event, which the official clients raise as an error. A lifespan start-up failure
reaches uvicorn without the traceback text, which uvicorn would log: the command prints one
line instead (app/run.py).
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from meshroute_middleware.chat.dialects import DIALECTS
from meshroute_middleware.chat.headers import is_sse
from meshroute_middleware.chat.relay import DRAIN_STATE
from meshroute_middleware.core.contracts.error_body import sse_error_event
from meshroute_middleware.http.errors import SHUTTING_DOWN_MESSAGE, HttpError
from meshroute_middleware.http.request import PATHS
from meshroute_middleware.telemetry.events import EventBus

ROUTED_PATHS = frozenset({*PATHS.values(), *DIALECTS})  # chat, embeddings, completions, dialects
SHUTTING_DOWN = SHUTTING_DOWN_MESSAGE


class _Open:
    """One chat request being served: the first and the last message its client was sent
    (kept as they pass, so the stream pays one attribute store per chunk)."""

    __slots__ = ("cut", "first", "last")

    def __init__(self) -> None:
        self.first: Message | None = None
        self.last: Message | None = None
        self.cut = False

    @property
    def started(self) -> bool:
        return self.first is not None

    @property
    def ended(self) -> bool:
        last = self.last
        return (last is not None and last["type"] == "http.response.body"
                and not last.get("more_body", False))


class Drain:
    """Ends open chat requests and event streams when the server stops (`drain`)."""

    def __init__(self, app: ASGIApp, events: EventBus,
                 paths: frozenset[str] = ROUTED_PATHS) -> None:
        self.app, self.events, self.paths = app, events, paths
        self.draining = False
        self._open: dict[asyncio.Task[Any], _Open] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, _quiet_startup_failure(send))
        elif scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
        elif self.draining:
            await HttpError.SHUTTING_DOWN.send(send, SHUTTING_DOWN)
        else:
            await self._chat(scope, receive, send)

    def stop_accepting(self) -> None:
        """The server stops: end every event stream; a new chat request gets a 503."""
        self.draining = True
        self.events.close()

    @property
    def in_flight(self) -> int:
        """Chat requests being served now."""
        return len(self._open)

    async def settle(self, timeout_s: float, poll_s: float = 0.05) -> bool:
        """Wait until no chat request is in flight, `timeout_s` at most; whether none is."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self._open and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(poll_s)
        return not self._open

    def drain(self) -> None:
        """Cut every chat request still in flight short (and stop accepting)."""
        self.stop_accepting()
        for task, state in self._open.items():
            state.cut = True
            task.cancel()

    async def _chat(self, scope: Scope, receive: Receive, send: Send) -> None:
        # the loop looked up once: current_task() without it costs a getpid() system call
        task = asyncio.current_task(self._loop) if self._loop is not None else None
        if task is None:
            self._loop = asyncio.get_running_loop()
            task = asyncio.current_task(self._loop)
            assert task is not None
        state = _Open()
        self._open[task] = state
        scope[DRAIN_STATE] = state  # a cut answer teaches its route nothing (chat/relay.py)

        async def tracked(message: Message) -> None:
            state.last = message
            if state.first is None:
                state.first = message
            await send(message)

        try:
            await self.app(scope, receive, tracked)
        except asyncio.CancelledError:
            if not state.cut:
                raise
            task.uncancel()  # our own cancellation: the client gets its ending below
        finally:
            del self._open[task]
        if state.cut and not state.ended:
            await _cut_short(send, state)


async def _cut_short(send: Send, state: _Open) -> None:
    try:
        if not state.started:
            await HttpError.SHUTTING_DOWN.send(send, SHUTTING_DOWN)
        elif state.first is not None and is_sse(state.first.get("headers", ())):
            await send({"type": "http.response.body", "more_body": False,
                        "body": sse_error_event(f"{SHUTTING_DOWN}; partial response",
                                                "shutting_down")})
    except OSError:  # the client left meanwhile
        pass


def _quiet_startup_failure(send: Send) -> Send:
    async def _send(message: Message) -> None:
        if message["type"] == "lifespan.startup.failed":
            message = {"type": "lifespan.startup.failed", "message": ""}
        await send(message)
    return _send
