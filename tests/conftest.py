"""Shared fixtures: anyio on asyncio, a fake clock; the parallel run's isolation (xdist)."""

from __future__ import annotations

import ctypes
import math
import os
import subprocess
import warnings

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


CLONE_NEWNET = 0x40000000  # <sched.h>; os.unshare arrives only in Python 3.12


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker runs in a network namespace of its own, with only loopback up.
    Tests announce and browse mDNS on `lo` and bind loopback ports: in one shared namespace the
    workers would see each other's nodes (same node ids, same service names). A namespace per
    worker keeps every test as alone as in a serial run. Unsharing needs CAP_SYS_ADMIN (root, or
    inside `scripts/isolated`'s user namespace); where it fails the workers share the network."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    # the calling thread moves; the threads and processes it starts from now on follow it, and
    # xdist runs the tests in this (the main) thread
    if libc.unshare(CLONE_NEWNET) != 0:
        warnings.warn(f"xdist worker without a network namespace of its own "
                      f"({os.strerror(ctypes.get_errno())}): mDNS tests may see each other",
                      stacklevel=1)
        return
    subprocess.run(["ip", "link", "set", "lo", "up"], check=True)


# Tests that must share one process under `--dist loadgroup`: a module-scoped fixture is built
# once per worker that runs any of its module's tests, so a module whose fixture starts servers
# stays on one worker; tests/engines/ stays on one worker as a whole (each module starts two
# llama-servers: two modules at once would be four on the machine's cores).
SHARED_SCOPES = ("module", "package", "session")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.nodeid.startswith("tests/engines/"):
            item.add_marker(pytest.mark.xdist_group("engines"))
            continue
        info = getattr(item, "_fixtureinfo", None)
        if info is None:
            continue
        for defs in info.name2fixturedefs.values():
            if any(d.scope in SHARED_SCOPES and d.baseid.startswith("tests") for d in defs):
                item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
                break


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
