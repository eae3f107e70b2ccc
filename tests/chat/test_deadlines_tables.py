"""The learned-deadline tables keep only the routes still in use (chat/deadlines.py
`RouteTable`): a route unseen for LEFT_AFTER_S has left and is dropped when a new route
comes, and at most MAX_ROUTES are kept (the least recently seen goes cold), so a mesh whose
routes come and go, or a config reloaded with other keys, leaves no memory behind. Fake
clock: no wall-clock bound."""

from __future__ import annotations

import asyncio

import pytest

from meshroute_middleware.chat.deadlines import (
    LEFT_AFTER_S,
    MAX_ROUTES,
    MIN_SAMPLES,
    FirstByteDeadlines,
    GapDeadlines,
    KeyDeadlines,
    RouteTable,
)

from ..conftest import FakeClock
from .virtual_time import run_virtual


def _warm(table: FirstByteDeadlines, route: str) -> None:
    for _ in range(MIN_SAMPLES):
        table.observe(route, 0.02)


@pytest.mark.parametrize("make", [FirstByteDeadlines, GapDeadlines])
def test_a_route_unseen_for_an_hour_is_dropped_when_a_new_route_comes(
        make: type[FirstByteDeadlines]) -> None:
    clock = FakeClock()
    table = make(clock=clock)
    _warm(table, "gone")
    _warm(table, "kept")
    clock.advance(LEFT_AFTER_S / 2)
    table.observe("kept", 0.02)
    clock.advance(LEFT_AFTER_S / 2 + 1)
    assert table.deadline_s("gone") is not None  # nothing new came: nothing swept
    table.observe("new", 0.02)
    assert table.deadline_s("gone") is None
    assert table.deadline_s("kept") is not None


def test_at_most_max_routes_are_kept_the_least_recently_seen_goes_cold() -> None:
    clock = FakeClock()
    table = FirstByteDeadlines(clock=clock)
    _warm(table, "oldest")
    clock.advance(1)
    _warm(table, "busy")
    for i in range(MAX_ROUTES - 2):
        clock.advance(0.001)
        table.observe(f"r{i}", 0.02)
    table.observe("busy", 0.02)  # seen again: now newer than every r{i}
    assert table.deadline_s("oldest") is not None  # MAX_ROUTES routes: all kept
    table.observe("one more", 0.02)
    assert table.deadline_s("oldest") is None
    assert table.deadline_s("busy") is not None


def test_the_table_never_holds_more_than_max_routes() -> None:
    clock = FakeClock()
    table: RouteTable[list[float]] = RouteTable(list, clock)
    for i in range(3 * MAX_ROUTES):
        clock.advance(0.001)
        table.seen(f"r{i}").append(1.0)
    assert len(table) == MAX_ROUTES
    assert table.get(f"r{3 * MAX_ROUTES - 1}") == [1.0]
    assert table.get("r0") is None


def test_provider_keys_that_left_are_dropped_and_leave_no_count_in_flight() -> None:
    clock = FakeClock()
    keys = KeyDeadlines(clock=clock)
    for _ in range(MIN_SAMPLES):
        keys.observe("fastco/big#1", 0.02, 1)
    assert keys.deadline_s("fastco/big#1", 1) is not None

    async def main() -> None:
        await keys.open("fastco/big#2", asyncio.sleep(0.01, "head"), 60.0)

    run_virtual(main)
    assert not keys._flying  # no entry per key once nothing is in flight
    clock.advance(LEFT_AFTER_S + 1)
    keys.observe("otherco/small#1", 0.02, 1)  # the config was reloaded: a new key
    assert keys.deadline_s("fastco/big#1", 1) is None
