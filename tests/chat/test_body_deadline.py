"""The body deadline (slowloris: 408) kept by one timer for every request reading its body
(chat/body_deadline.py): a body that does not arrive in time is a 408 through the middleware,
a body that arrives costs no timer of its own, and a cancellation that is not the deadline's
stays a cancellation."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from meshroute_middleware.chat.body_deadline import BodyDeadlines
from meshroute_middleware.http.errors import RequestError
from meshroute_middleware.middleware import MeshRouteMiddleware, MiddlewareConfig

pytestmark = pytest.mark.anyio
CHAT = {"type": "http", "method": "POST", "path": "/v1/chat/completions", "headers": [],
        "query_string": b"", "state": {}}


async def never() -> Any:
    await asyncio.Event().wait()


async def test_a_body_that_never_arrives_is_a_408_and_its_deadline_is_gone() -> None:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError("a request without its body reached the app")
    mw = MeshRouteMiddleware(app, MiddlewareConfig(body_timeout_s=0.05))
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)
    await asyncio.wait_for(mw(dict(CHAT), never, send), 30)
    assert sent[0]["status"] == 408
    assert b'"request_timeout"' in sent[1]["body"]
    assert not mw._bodies._reading and not mw._bodies._expired


async def test_bodies_that_arrive_leave_nothing_behind_and_share_one_timer() -> None:
    deadlines = BodyDeadlines(30.0)
    loop = asyncio.get_running_loop()
    timers_before = len(loop._scheduled)  # type: ignore[attr-defined]

    async def read() -> None:
        with deadlines:
            await asyncio.sleep(0)
    await asyncio.gather(*(read() for _ in range(50)))
    for _ in range(50):
        await asyncio.create_task(read())
    assert not deadlines._reading and not deadlines._expired
    # one timer (armed at the first one's deadline), not one per body read
    assert len(loop._scheduled) - timers_before == 1  # type: ignore[attr-defined]


async def test_each_task_is_cut_at_its_own_deadline() -> None:
    deadlines = BodyDeadlines(0.05)
    loop = asyncio.get_running_loop()
    cut: list[float] = []

    async def read(delay_s: float) -> None:
        await asyncio.sleep(delay_s)
        start = loop.time()
        try:
            with deadlines:
                await never()
        except RequestError as exc:
            assert exc.status == 408
            cut.append(loop.time() - start)
    await asyncio.wait_for(asyncio.gather(read(0.0), read(0.2)), 30)
    assert len(cut) == 2 and all(c >= 0.05 for c in cut)  # neither cut before its deadline


async def test_a_cancellation_that_is_not_the_deadline_stays_one() -> None:
    deadlines = BodyDeadlines(30.0)

    async def read() -> None:
        with deadlines:
            await never()
    task = asyncio.create_task(read())
    await asyncio.sleep(0)
    task.cancel()  # the client left, or the server stops
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not deadlines._reading and not deadlines._expired


async def test_a_deadline_and_another_cancellation_together_stay_a_cancellation() -> None:
    deadlines = BodyDeadlines(30.0)
    started = asyncio.Event()

    async def read() -> None:
        with deadlines:
            started.set()
            await never()
    task = asyncio.create_task(read())
    await started.wait()
    deadlines._reading[task] = 0.0  # its deadline has passed: the sweep cuts it ...
    deadlines._sweep()
    task.cancel()  # ... while the server stops
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 30)
    assert not deadlines._reading and not deadlines._expired
