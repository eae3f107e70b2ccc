"""Issue 22, item 1 — background services run supervised: a failure is logged, counted,
shown degraded on /healthz and restarted with backoff; it never ends the other services."""

from __future__ import annotations

import logging
import time
from typing import Any

import anyio
import httpx
import pytest
from starlette.testclient import TestClient

from meshroute_middleware.app import services
from meshroute_middleware.app.mitm.relay import Relay
from meshroute_middleware.app.mitm.side import build_side_app
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.app.supervise import SuperviseConfig, Supervisor, failure_text
from meshroute_middleware.mesh import Mesh
from meshroute_middleware.middleware import build_router
from meshroute_middleware.telemetry.metrics import Telemetry
from meshroute_middleware.telemetry.services import ServiceStates

from ..node_agent.conftest import PATIENCE_S
from ..security.edge_util import EdgeGateway

pytestmark = pytest.mark.anyio
FAST = SuperviseConfig(first_backoff_s=0.01, max_backoff_s=0.04, stable_after_s=60)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_a_failing_service_is_restarted_and_the_others_go_on(
        caplog: pytest.LogCaptureFixture) -> None:
    states = ServiceStates()
    supervisor = Supervisor(states, FAST)
    runs: list[int] = []
    ticks: list[int] = []

    async def flaky() -> None:
        runs.append(1)
        if len(runs) <= 3:
            raise ValueError("bad \x1b[31m input")
        await anyio.sleep_forever()

    async def steady() -> None:
        while True:
            ticks.append(1)
            await anyio.sleep(0.005)

    with caplog.at_level(logging.ERROR, "meshroute.supervise"):
        async with anyio.create_task_group() as tg:
            tg.start_soon(supervisor.run, "flaky", flaky)
            tg.start_soon(supervisor.run, "steady", steady)
            with anyio.fail_after(PATIENCE_S):
                while len(runs) < 4:
                    await anyio.sleep(0.005)
            before = len(ticks)
            await anyio.sleep(0.05)
            assert len(ticks) > before  # the other service never stopped
            assert states.failures("flaky") == 3 and states.degraded() == {}
            tg.cancel_scope.cancel()
    assert states.degraded() == {}  # stopped on purpose: nothing reported
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3 and all("flaky failed (ValueError: bad \\x1b[31m input)" in line
                                   for line in lines)
    assert not any("\x1b" in line for line in lines)


async def test_it_is_degraded_while_it_waits_to_restart() -> None:
    states = ServiceStates()
    slow = SuperviseConfig(first_backoff_s=30, max_backoff_s=30)

    async def broken() -> None:
        raise RuntimeError("gone")

    async with anyio.create_task_group() as tg:
        tg.start_soon(Supervisor(states, slow).run, "broken", broken)
        with anyio.fail_after(PATIENCE_S):
            while not states.degraded():
                await anyio.sleep(0.005)
        assert states.degraded() == {"broken": "RuntimeError: gone"}
        tg.cancel_scope.cancel()


async def test_a_service_that_returns_counts_as_failed_and_runs_again() -> None:
    states, runs = ServiceStates(), []

    async def quits() -> None:
        runs.append(1)

    async with anyio.create_task_group() as tg:
        tg.start_soon(Supervisor(states, FAST).run, "quits", quits)
        with anyio.fail_after(PATIENCE_S):
            while len(runs) < 2:
                await anyio.sleep(0.005)
        assert states.failures("quits") >= 1
        tg.cancel_scope.cancel()


async def test_a_failure_before_the_service_started_is_a_start_error() -> None:
    async def cannot_bind(*, task_status: Any) -> None:
        raise OSError("address in use")

    with pytest.raises((OSError, BaseExceptionGroup)) as raised:
        async with anyio.create_task_group() as tg:
            await tg.start(Supervisor(ServiceStates(), FAST).run_started, "gossip",
                           cannot_bind)
    assert failure_text(raised.value) == "OSError: address in use"


def test_failure_text_unwraps_task_group_errors() -> None:
    group = ExceptionGroup("unhandled errors in a TaskGroup", [KeyError("x")])
    assert failure_text(BaseExceptionGroup("outer", [group])) == "KeyError: 'x'"


def test_healthz_is_503_degraded_while_a_service_restarts_then_200_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway whose route pruning fails: /healthz answers 503 with `degraded` naming it
    (JSON), the failure is counted in /metrics, and once the
    service runs again /healthz is back to its 200 shape."""
    broken = {"yes": True}

    async def prune(*routers: Any) -> None:
        if broken["yes"]:
            raise RuntimeError("pruning broke")
        await anyio.sleep_forever()

    monkeypatch.setattr(services, "_prune_loop", prune)
    with EdgeGateway() as gw:
        health = _until(gw.url, lambda r: r.status_code == 503)
        body = health.json()
        assert body["ok"] is False and body["tracker"] and "models" in body
        assert body["degraded"] == {"pruning": "RuntimeError: pruning broke"}
        metrics = httpx.get(gw.url + "/metrics").text
        assert 'meshroute_service_failures_total{service="pruning"}' in metrics
        assert httpx.post(gw.url + "/v1/nodes", json={}).status_code == 400  # still serving
        broken["yes"] = False
        health = _until(gw.url, lambda r: r.status_code == 200)
        assert set(health.json()) == {"ok", "models", "tracker"}


def test_the_mitm_side_server_runs_its_services_supervised(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The mitm side server composes the same background services (app/mitm/side.py)."""
    async def prune(*routers: Any) -> None:
        raise RuntimeError("side pruning broke")

    monkeypatch.setattr(services, "_prune_loop", prune)
    router = build_router()
    mesh = Mesh(router, Telemetry(router))
    app = build_side_app(ServeSettings(mdns=False), mesh, Relay(), "side", 0)
    with TestClient(app) as client:
        deadline = time.monotonic() + PATIENCE_S
        while (health := client.get("/healthz")).status_code != 503:
            assert time.monotonic() < deadline, health.text
            time.sleep(0.01)
        assert "pruning" in health.json()["degraded"]


def _until(url: str, ok: Any) -> httpx.Response:
    deadline = time.monotonic() + PATIENCE_S
    while True:
        response = httpx.get(url + "/healthz", timeout=5)
        if ok(response):
            return response
        assert time.monotonic() < deadline, response.text
        time.sleep(0.01)
