"""The routing event stream: route-selected and outcome events, with a bounded history."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

HISTORY = 500  # events kept for late subscribers
QUEUE = 1000  # events buffered per slow subscriber before it misses some


class EventBus:
    """Publish is synchronous and never blocks; each subscriber gets its own queue."""

    def __init__(self, history: int = HISTORY) -> None:
        self._history: deque[dict[str, Any]] = deque(maxlen=history)
        self._subscribers: set[asyncio.Queue[dict[str, Any]]] = set()
        self._ids = itertools.count(1)
        self.dropped = 0

    def publish(self, kind: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Add an event (`type`, `id`, `ts` are filled in) and hand it to every subscriber."""
        event = {"type": kind, "id": next(self._ids), "ts": time.time(), **payload}
        self._history.append(event)
        for queue in self._subscribers:
            try:
                queue.put_nowait(event)
            except asyncio.QueueFull:
                self.dropped += 1
        return event

    def history(self, since_id: int = 0) -> list[dict[str, Any]]:
        """Events kept in memory with an id above `since_id`."""
        return [e for e in self._history if e["id"] > since_id]

    async def subscribe(self, since_id: int = 0) -> AsyncIterator[dict[str, Any]]:
        """The history after `since_id`, then live events, until the consumer stops."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(QUEUE)
        self._subscribers.add(queue)
        try:
            last = since_id
            for event in self.history(since_id):
                last = event["id"]
                yield event
            while True:
                event = await queue.get()
                if event["id"] > last:
                    yield event
        finally:
            self._subscribers.discard(queue)


def sse(event: dict[str, Any]) -> bytes:
    """One event in Server-Sent Events framing."""
    return (f"id: {event['id']}\nevent: {event['type']}\n"
            f"data: {json.dumps(event, separators=(',', ':'))}\n\n").encode()
