"""The routing event stream: route-selected and outcome events, with a bounded history.

Publishing is on every request's path, so it is O(1) whatever the number of subscribers: an
event is a plain tuple of atoms and the function that renders it, appended to the history;
the fan-out to subscribers runs later, once per batch, in one callback the loop schedules
(`call_soon`), and each event is turned into its JSON-ready dict once per batch, not once per
subscriber. Subscribers are bounded (`max_subscribers`): a new one past the cap closes the
oldest; a subscriber too slow to take its buffer misses events. Both are counted.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextvars import ContextVar
from typing import Any, Protocol, TypeVar

HISTORY = 500  # events kept for late subscribers
QUEUE = 1000  # events buffered per slow subscriber before it misses some
MAX_SUBSCRIBERS = 64  # open /v1/routing/events streams; docs/benchmarks.md "Bounds"

Payload = dict[str, Any]
T = TypeVar("T")
# (id, type, ts, render, content): the event is {"type", "id", "ts", **render(content)}
Entry = tuple[int, str, float, Callable[[Any], Payload], Any]
_NONE: frozenset[int] = frozenset()


class Tap(Protocol):
    """A request's tracer (telemetry/tracing.py): every event published while serving the
    request, as it is published; and the trace headers its upstream attempt sends."""

    def __call__(self, entry: Entry) -> None: ...

    def upstream_headers(self) -> list[tuple[str, str]]: ...


TAP: ContextVar[Tap | None] = ContextVar("meshroute_event_tap", default=None)  # None: no traces


def as_is(payload: Payload) -> Payload:
    """A render for a payload that is its own fields."""
    return payload


def materialize(entry: Entry) -> Payload:
    """An event as its subscribers get it."""
    event_id, kind, ts, render, content = entry
    return {"type": kind, "id": event_id, "ts": ts, **render(content)}


class _Subscriber:
    """One open stream: its buffer of events, a wake-up, and whether it was closed."""

    __slots__ = ("buffer", "closed", "skip", "wake")

    def __init__(self, skip: frozenset[int]) -> None:
        self.buffer: deque[Payload] = deque()
        self.wake = asyncio.Event()
        self.closed = False
        self.skip = skip  # events it will get twice: in its history, then from its buffer


class EventBus:
    """Publish is synchronous, O(1) and never blocks; fan-out happens off the request path."""

    def __init__(self, history: int = HISTORY, max_subscribers: int = MAX_SUBSCRIBERS) -> None:
        self._history: deque[Entry] = deque(maxlen=history)
        self._subscribers: dict[_Subscriber, None] = {}  # insertion order: oldest first
        self.max_subscribers = max_subscribers
        self._last_id = 0
        self._pending: deque[Entry] = deque()  # published, not yet handed to subscribers
        self._scheduled = False
        self.closed = False  # a stopping server: no subscription stays open
        self.dropped = 0  # events a slow subscriber missed (exported as a metric)
        self.subscribers_dropped = 0  # streams closed to make room (exported as a metric)

    @property
    def history_size(self) -> int:
        """How many events the history keeps."""
        return self._history.maxlen or 0

    def entries(self) -> list[Entry]:
        """The history as kept (events not rendered yet)."""
        return list(self._history)

    @property
    def subscriber_count(self) -> int:
        """Open subscriber streams."""
        return len(self._subscribers)

    def publish(self, kind: str, payload: Payload) -> None:
        """Add an event (`type`, `id`, `ts` are filled in); subscribers get it soon after."""
        self.publish_lazy(kind, as_is, payload)

    def publish_lazy(self, kind: str, render: Callable[[T], Payload], content: T) -> None:
        """Add an event whose fields are `render(content)`, computed only when it is read.
        `content` must not change afterwards: a tuple of atoms is best (the history keeps it,
        and the garbage collector stops scanning such a tuple)."""
        self._last_id += 1
        self._add((self._last_id, kind, time.time(), render, content))

    def _add(self, entry: Entry) -> None:
        """Keep an event and queue it for the subscribers."""
        tap = TAP.get()
        if tap is not None:
            tap(entry)
        self._history.append(entry)
        if not self._subscribers:
            return
        if len(self._pending) >= QUEUE:  # a burst longer than any buffer: the newest miss it
            self.dropped += len(self._subscribers)
            return
        self._pending.append(entry)
        if not self._scheduled:
            try:  # once per batch, not per event: the first event of a batch schedules it
                loop = asyncio.get_running_loop()
            except RuntimeError:  # published outside the loop: the next batch carries it
                return
            self._scheduled = True
            loop.call_soon(self._fan_out)

    def _fan_out(self) -> None:
        """Hand every event published since the last call to every subscriber (one batch)."""
        self._scheduled = False
        batch = [materialize(e) for e in self._pending]
        self._pending.clear()
        for sub in self._subscribers:
            overflow = len(sub.buffer) + len(batch) - QUEUE
            if overflow > 0:  # a slow reader: it misses the newest events
                self.dropped += overflow
                sub.buffer.extend(batch[:len(batch) - overflow])
            else:
                sub.buffer.extend(batch)
            sub.wake.set()

    def close(self) -> None:
        """End every subscription now, and any later one after its history (a stopping
        server: open streams must not hold it, nor a client that reconnects)."""
        self.closed = True
        for sub in self._subscribers:
            sub.closed = True
            sub.wake.set()

    def history(self, since_id: int = 0) -> list[Payload]:
        """Events kept in memory with an id above `since_id`."""
        return [materialize(e) for e in self._history if e[0] > since_id]

    def _join(self) -> _Subscriber:
        while len(self._subscribers) >= self.max_subscribers > 0:
            oldest = next(iter(self._subscribers))
            del self._subscribers[oldest]
            oldest.closed = True
            oldest.wake.set()
            self.subscribers_dropped += 1
        # published before it joined, not yet handed out: its history has them already
        sub = _Subscriber(frozenset(e[0] for e in self._pending) if self._pending else _NONE)
        sub.closed = self.closed
        self._subscribers[sub] = None
        return sub

    async def subscribe(self, since_id: int = 0) -> AsyncIterator[Payload]:
        """The history after `since_id`, then live events, until the consumer stops or a
        newer subscriber past the cap closes this one. Ids need not arrive in order (a
        worker of several gets its siblings' events a moment late: relay.py)."""
        sub = self._join()
        try:
            for event in self.history(since_id):
                yield event
            skip = sub.skip
            while not sub.closed:
                while sub.buffer:
                    event = sub.buffer.popleft()
                    if event["id"] > since_id and event["id"] not in skip:
                        yield event
                sub.wake.clear()
                if not sub.buffer and not sub.closed:
                    await sub.wake.wait()
        finally:
            self._subscribers.pop(sub, None)


def sse(event: Payload) -> bytes:
    """One event in Server-Sent Events framing."""
    return (f"id: {event['id']}\nevent: {event['type']}\n"
            f"data: {json.dumps(event, separators=(',', ':'))}\n\n").encode()
