"""EventBus.close ends every open subscription, so an open dashboard cannot hold a stop."""

from __future__ import annotations

import asyncio

import pytest

from meshroute_middleware.telemetry.events import QUEUE, EventBus

pytestmark = pytest.mark.anyio


@pytest.mark.parametrize("backlog", [0, QUEUE + 5])  # a full queue ends too
async def test_close_ends_open_subscriptions(backlog: int) -> None:
    bus = EventBus()
    got: list[int] = []

    async def read() -> None:
        async for event in bus.subscribe():
            got.append(event["id"])
            if len(got) == 1:
                started.set()
                await release.wait()

    started, release = asyncio.Event(), asyncio.Event()
    bus.publish("node", {"n": 0})
    reader = asyncio.ensure_future(read())
    await started.wait()
    for i in range(backlog):
        bus.publish("node", {"n": i + 1})
    bus.close()
    release.set()
    await asyncio.wait_for(reader, 5)  # ends by itself; 5 s only bounds a failure
    assert got[0] == 1 and len(got) <= 1 + backlog


async def test_a_subscription_after_close_ends_after_its_history() -> None:
    """A dashboard's EventSource reconnects by itself: on a stopping server its new stream
    must end too, not hold the stop."""
    bus = EventBus()
    bus.publish("node", {"n": 0})
    bus.close()
    async def read() -> list[int]:
        return [event["id"] async for event in bus.subscribe()]

    assert await asyncio.wait_for(read(), 5) == [1]  # it ends; 5 s only bounds a failure
    assert bus.subscriber_count == 0
