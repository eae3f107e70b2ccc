"""Test doubles shared by the node agent's tests."""

from __future__ import annotations

from typing import Any


class RecordingService:
    """Stands in for the announcer's mDNS service: keeps every record update it is sent."""

    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def update(self, info: Any) -> None:
        self.sent.append(info)
