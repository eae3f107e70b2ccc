"""Every worker's events on every worker's bus (relay.py): ids, late siblings' events, and two
relays over real Unix sockets in one loop."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from meshroute_middleware.telemetry import relay as relay_module
from meshroute_middleware.telemetry.events import EventBus
from meshroute_middleware.telemetry.relay import Relay, WorkerEventBus

pytestmark = pytest.mark.anyio


@pytest.fixture
def run_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="mr-relay-"))  # short: a socket path has 108 bytes
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_ids_are_unique_across_workers_and_above_every_id_seen() -> None:
    bus = WorkerEventBus(1, 2)
    bus.publish("node", {"n": 0})
    bus.publish("node", {"n": 1})
    assert [e["id"] for e in bus.history()] == [3, 5]  # n × 2 + 1: never worker 0's
    assert bus.ingest([{"type": "outcome", "id": 10, "ts": 1.0, "worker": 0},
                       {"type": "outcome", "id": "x", "ts": 1.0}, "junk"]) == 1
    bus.publish("node", {"n": 2})
    events = bus.history()
    assert [e["id"] for e in events] == [3, 5, 10, 13]
    assert [e["worker"] for e in events] == [1, 1, 0, 1]


def test_a_replacing_bus_keeps_the_history_renumbered() -> None:
    old = EventBus()
    old.publish("node", {"change": "join"})
    new = WorkerEventBus.replacing(old, 0, 3)
    assert new.history() == [{"type": "node", "id": 3, "ts": old.history()[0]["ts"],
                              "change": "join", "worker": 0}]
    assert new.take_outbox() == []  # the siblings built their own


async def _first(stream: AsyncIterator[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    return [await anext(stream) for _ in range(n)]


async def test_a_subscriber_gets_a_siblings_late_event_with_a_lower_id() -> None:
    bus = WorkerEventBus(1, 2)
    stream = bus.subscribe()
    bus.publish("node", {"n": 0})  # id 3
    first = await asyncio.wait_for(anext(stream), 5)
    bus.ingest([{"type": "outcome", "id": 2, "ts": 1.0, "worker": 0}])  # sent before id 3
    late = await asyncio.wait_for(anext(stream), 5)
    assert (first["id"], late["id"]) == (3, 2)
    await stream.aclose()


async def test_a_new_subscriber_gets_an_event_not_yet_handed_out_once() -> None:
    bus = EventBus()
    early = bus.subscribe()
    bus.publish("node", {"n": 0})
    first = asyncio.ensure_future(anext(early))
    await asyncio.sleep(0)  # early waits; the event is queued for the next batch
    bus.publish("node", {"n": 1})  # queued, not yet handed out, when `late` joins
    late = bus.subscribe()
    got = await asyncio.wait_for(_first(late, 2), 5)
    bus.publish("node", {"n": 2})
    got.append(await asyncio.wait_for(anext(late), 5))
    assert [e["n"] for e in got] == [0, 1, 2]
    await first
    for stream in (early, late):
        await stream.aclose()


async def _until(check: Any, what: str) -> None:
    for _ in range(500):  # bounded: 5 s of 10 ms turns on a loaded machine
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(what)


async def test_two_workers_see_each_others_events_over_unix_sockets(run_dir: Path) -> None:
    buses = [WorkerEventBus(i, 2) for i in range(2)]
    relays = [Relay(bus, run_dir, i, 2) for i, bus in enumerate(buses)]
    buses[0].publish("outcome", {"n": "before"})  # before any relay runs: queued
    first = asyncio.ensure_future(relays[0].run())
    await asyncio.sleep(0.05)
    buses[0].publish("outcome", {"n": "sibling down"})  # worker 1 not listening yet: queued
    second = asyncio.ensure_future(relays[1].run())
    stream = buses[1].subscribe()
    try:
        buses[1].publish("outcome", {"n": "own"})
        buses[0].publish("outcome", {"n": "live"})
        got = await asyncio.wait_for(_first(stream, 4), 10)
        assert sorted(e["n"] for e in got) == ["before", "live", "own", "sibling down"]
        assert {e["n"]: e["worker"] for e in got}["live"] == 0
        await _until(lambda: any(e.get("n") == "own" for e in buses[0].history()),
                     "worker 0 never got worker 1's event")
        assert relays[0].dropped == relays[1].dropped == 0
    finally:
        await stream.aclose()
        for task in (first, second):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_a_sibling_that_never_comes_costs_a_bounded_queue(
        run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_module, "MAX_QUEUED_BYTES", 1000)
    bus = WorkerEventBus(0, 2)
    relay = Relay(bus, run_dir, 0, 2)
    task = asyncio.ensure_future(relay.run())
    try:
        for n in range(20):
            bus.publish("outcome", {"pad": "x" * 100, "n": n})
            await asyncio.sleep(0)  # one batch each
        await _until(lambda: relay.dropped > 0, "nothing dropped")
        link = relay.links[1]
        queued = sum(line.count(b'"type"') for line in link.queue)  # events, in lines
        assert link.queued <= 1000 and relay.dropped + queued == 20
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def test_without_a_running_relay_the_outbox_stays_bounded(
        run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(relay_module, "MAX_OUTBOX", 3)
    bus = WorkerEventBus(0, 2)
    relay = Relay(bus, run_dir, 0, 2)
    for n in range(5):
        bus.publish("outcome", {"n": n})
    assert len(bus.outbox) == 3 and len(bus.history()) == 5  # its own subscribers get all
    samples = {s.name: s.value for m in relay.metric_families() for s in m.samples}
    assert samples["meshroute_worker_events_dropped_total"] == 2
