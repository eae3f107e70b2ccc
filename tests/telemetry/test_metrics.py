"""Telemetry: every counter it keeps is exported."""

from __future__ import annotations

import asyncio

import pytest

from meshroute_middleware.middleware import build_router
from meshroute_middleware.telemetry.events import QUEUE
from meshroute_middleware.telemetry.metrics import Telemetry
from tests.conftest import FakeClock

pytestmark = pytest.mark.anyio


async def test_events_a_slow_subscriber_missed_are_counted_in_metrics() -> None:
    telemetry = Telemetry(build_router(clock=FakeClock()))
    assert "meshroute_events_dropped_total 0.0" in telemetry.render().decode()
    stream = telemetry.events.subscribe()
    telemetry.events.publish("node", {"n": -1})
    assert (await anext(stream))["n"] == -1  # from the history: the subscriber is live now
    for n in range(QUEUE + 3):  # nobody reads: the subscriber's queue holds QUEUE of them
        telemetry.events.publish("node", {"n": n})
    await asyncio.sleep(0)  # one loop turn: the bus fans events out off the publisher's path
    assert "meshroute_events_dropped_total 3.0" in telemetry.render().decode()
    assert (await anext(stream))["n"] == 0
    await stream.aclose()
