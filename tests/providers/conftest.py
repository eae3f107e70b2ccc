"""The two fake providers most provider tests run against (a test module may override)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .fake_provider import FakeProvider


@pytest.fixture
def providers() -> Iterator[tuple[FakeProvider, FakeProvider]]:
    """`fast` serving big-model and `slow` serving small-model, each on 127.0.0.1."""
    fast, slow = FakeProvider("fast"), FakeProvider("slow", models=("small-model",))
    with fast.serve(), slow.serve():
        yield fast, slow
