"""Shared fixtures: anyio on asyncio, a fake clock."""

from __future__ import annotations

import math

import pytest

from meshroute_middleware.core.stats import UNSAMPLED_VIEW, RouteStatsStore, RouteView

try:
    from hypothesis import settings
except ImportError:  # the mitm venv runs only tests/mitm, without hypothesis
    pass
else:
    # Hypothesis times each example against a 200 ms deadline by default: a wall-clock bound
    # a loaded machine cannot keep (a byte-flip example took 280 ms under stress-ng once,
    # 0.4 ms on rerun). The suite checks properties, not speed; benchmarks/ measures speed.
    settings.register_profile("meshroute", deadline=None)
    settings.load_profile("meshroute")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class FakeClock:
    """A settable wall clock for the pure core."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture(autouse=True)
def _state_home(tmp_path_factory: pytest.TempPathFactory,
                monkeypatch: pytest.MonkeyPatch) -> None:
    """No test writes the user's state directory, where `meshroute serve` keeps its default
    state file: XDG_STATE_HOME is a temporary directory (processes a test starts inherit it)."""
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path_factory.mktemp("state-home")))


def route_view(store: RouteStatsStore, model: str, signature: str, now: float,
               changed_at: float = -math.inf) -> RouteView:
    """One route's merged statistics at `now`, read as the router reads them."""
    merged = store.merged(model, signature, changed_at)
    return UNSAMPLED_VIEW if merged is None else merged.at(now)


def stat_keys(store: RouteStatsStore, model: str | None = None) -> list[tuple[str, str]]:
    """Every (model, signature) with statistics, sorted (from the gossip state)."""
    return sorted(k for k in store.state() if model is None or k[0] == model)
