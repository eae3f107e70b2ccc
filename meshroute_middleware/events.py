"""The routing event stream: route-selected and outcome events, with a bounded history.

Publishing is on every request's path, so an event may be published as a plain tuple of
atoms and the function that renders it, turned into its JSON-ready dict only when somebody
reads it (a subscriber, or the history).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeVar

HISTORY = 500  # events kept for late subscribers
QUEUE = 1000  # events buffered per slow subscriber before it misses some

Payload = dict[str, Any]
T = TypeVar("T")
# (id, type, ts, render, content): the event is {"type", "id", "ts", **render(content)}
_Entry = tuple[int, str, float, Callable[[Any], Payload], Any]


def _same(payload: Payload) -> Payload:
    return payload


def _materialize(entry: _Entry) -> Payload:
    event_id, kind, ts, render, content = entry
    return {"type": kind, "id": event_id, "ts": ts, **render(content)}


_END: Payload = {}  # by identity: the end of a subscription


class EventBus:
    """Publish is synchronous and never blocks; each subscriber gets its own queue."""

    def __init__(self, history: int = HISTORY) -> None:
        self._history: deque[_Entry] = deque(maxlen=history)
        self._subscribers: set[asyncio.Queue[Payload]] = set()
        self._last_id = 0
        self.dropped = 0  # events a slow subscriber missed (exported as a metric)

    def publish(self, kind: str, payload: Payload) -> None:
        """Add an event (`type`, `id`, `ts` are filled in) and hand it to every subscriber."""
        self.publish_lazy(kind, _same, payload)

    def publish_lazy(self, kind: str, render: Callable[[T], Payload], content: T) -> None:
        """Add an event whose fields are `render(content)`, computed only when it is read.
        `content` must not change afterwards: a tuple of atoms is best (the history keeps it,
        and the garbage collector stops scanning such a tuple)."""
        self._last_id += 1
        entry: _Entry = (self._last_id, kind, time.time(), render, content)
        self._history.append(entry)
        if self._subscribers:
            event = _materialize(entry)
            for queue in self._subscribers:
                try:
                    queue.put_nowait(event)
                except asyncio.QueueFull:
                    self.dropped += 1

    def close(self) -> None:
        """End every subscription now (a stopping server: open streams must not hold it)."""
        for queue in self._subscribers:
            while queue.full():
                queue.get_nowait()
            queue.put_nowait(_END)

    def history(self, since_id: int = 0) -> list[Payload]:
        """Events kept in memory with an id above `since_id`."""
        return [_materialize(e) for e in self._history if e[0] > since_id]

    async def subscribe(self, since_id: int = 0) -> AsyncIterator[Payload]:
        """The history after `since_id`, then live events, until the consumer stops."""
        queue: asyncio.Queue[Payload] = asyncio.Queue(QUEUE)
        self._subscribers.add(queue)
        try:
            last = since_id
            for event in self.history(since_id):
                last = event["id"]
                yield event
            while True:
                event = await queue.get()
                if event is _END:
                    return
                if event["id"] > last:
                    yield event
        finally:
            self._subscribers.discard(queue)


def sse(event: Payload) -> bytes:
    """One event in Server-Sent Events framing."""
    return (f"id: {event['id']}\nevent: {event['type']}\n"
            f"data: {json.dumps(event, separators=(',', ':'))}\n\n").encode()
