"""RequestTally: chat requests counted by what their client got, as /v1/routing shows them."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from meshroute_middleware.core import parse_node
from meshroute_middleware.core.contracts.error_body import sse_error_event
from meshroute_middleware.middleware import MeshRouteMiddleware, MiddlewareConfig
from meshroute_middleware.telemetry.requests import RequestTally, answered

pytestmark = pytest.mark.anyio


def _answer(status: int, *bodies: bytes) -> Any:
    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": status, "headers": []})
        for i, body in enumerate(bodies):
            await send({"type": "http.response.body", "body": body,
                        "more_body": i < len(bodies) - 1})
    return app


async def _broken(scope: Scope, receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})
    raise OSError("the head broke off")  # the response never ends


async def _receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _sink(message: Message) -> None:
    pass


async def _serve(tally: RequestTally, app: Any) -> None:
    """As MeshRouteMiddleware serves a chat request."""
    watched = tally.watch(_sink)
    try:
        await app({"type": "http"}, _receive, watched)
    finally:
        watched.close()


@pytest.mark.parametrize(("app", "answered"), [
    (_answer(200, b"{}"), True),
    (_answer(200, b"data: {}\n\n", b"data: [DONE]\n\n"), True),
    (_answer(200, b"data: {}\n\n", sse_error_event("the head died")), False),  # SSE error
    (_answer(503, b'{"error": {}}'), False),
    (_answer(429, b'{"error": {}}'), False),
    (_answer(404, b'{"error": {}}'), False),
])
async def test_a_request_counts_by_the_answer_its_client_got(app: Any, answered: bool) -> None:
    tally = RequestTally()
    await _serve(tally, app)
    assert tally.to_dict() == {"answered": int(answered), "failed": int(not answered)}


async def test_a_response_that_never_ends_is_a_failed_request() -> None:
    tally = RequestTally()
    with pytest.raises(OSError):
        await _serve(tally, _broken)
    assert tally.to_dict() == {"answered": 0, "failed": 1}


def _node(node_id: str) -> Any:
    return parse_node({"node_id": node_id, "model": "m", "start": 0, "end": 9, "layers": 10,
                       "url": "http://127.0.0.1:1", "tps": 10.0})


async def test_an_attempt_that_fell_back_is_no_failed_request() -> None:
    """The app fails the first route with a 503 and answers on the next: one attempt failed,
    one request answered; an unknown model is a failed request."""
    calls: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        calls.append(scope["state"]["meshroute"]["signature"])
        status = 503 if len(calls) == 1 else 200
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": b'{"usage": {}}'})

    mw = MeshRouteMiddleware(app, MiddlewareConfig(mode="annotate"))
    mw.router.upsert_node(_node("a"))
    mw.router.upsert_node(_node("b"))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=mw),
                                 base_url="http://t") as client:
        ok = await client.post("/v1/chat/completions", json={"model": "m"})
        missing = await client.post("/v1/chat/completions",
                                    json={"model": "nope", "route": ["x"]})
    assert ok.status_code == 200 and len(calls) == 2
    assert missing.status_code >= 400
    assert mw.telemetry.outcomes[("m", "failure")] == 1  # the attempt that fell back
    assert mw.telemetry.requests is not None
    assert mw.telemetry.requests.to_dict() == {"answered": 1, "failed": 1}


@pytest.mark.parametrize(("status", "body", "ok"), [
    (200, b'{"choices": []}', True),
    (200, b"data: {}\n\n" * 100 + b"data: [DONE]\n\n", True),
    (200, b"data: {}\n\n" * 100 + sse_error_event("the head died"), False),
    (503, b'{"error": {}}', False),
])
def test_a_client_and_the_gateway_judge_an_answer_alike(status: int, body: bytes,
                                                        ok: bool) -> None:
    """`answered` on the client's whole body (the demo's terminal) says what the gateway's
    tally says from its last message."""
    assert answered(status, body) is ok
