"""Background services run supervised: a failure is logged, counted and restarted.

One hostile mDNS packet once ended the task group of every background service, leaving a
frozen mesh behind an HTTP server that kept answering (issue 22). Each service (discovery,
health checks, gossip, route pruning, the state saver) now runs under `Supervisor.run`: if it
raises or returns it is logged (its message escaped), counted
(`meshroute_service_failures_total{service}`), reported degraded by `/healthz` and restarted
after a backoff that doubles from `first_backoff_s` to `max_backoff_s` (reset once a run
lasted `stable_after_s`). Cancellation (shutdown) is never caught. A failure before a service
reported itself started is a start error and propagates, as it did unsupervised.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import anyio
import anyio.abc

from meshroute_middleware.core.logsafe import shown
from meshroute_middleware.telemetry.services import ServiceStates

log = logging.getLogger("meshroute.supervise")

Service = Callable[[], Awaitable[None]]
StartedService = Callable[..., Awaitable[None]]  # takes task_status=, as for task_group.start


@dataclass(frozen=True, slots=True)
class SuperviseConfig:
    """How failed services are restarted (the one home of these defaults)."""

    first_backoff_s: float = 0.5
    max_backoff_s: float = 30.0
    stable_after_s: float = 60.0  # a run this long was healthy: the next failure waits less

    def __post_init__(self) -> None:
        if not 0 < self.first_backoff_s <= self.max_backoff_s:
            raise ValueError(f"backoffs must be positive and ordered, got {self}")


def failure_text(exc: BaseException) -> str:
    """`Type: message` of the innermost first error of an exception (groups unwrapped)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return f"{type(exc).__name__}: {exc}"


def until_cancelled(context: Callable[[], AbstractAsyncContextManager[Any]]) -> Service:
    """A service made of an async context manager (discovery): entered, held until
    cancelled; a failure of a task inside it ends the service (and so restarts it)."""
    async def service() -> None:
        async with context():
            await anyio.sleep_forever()
    return service


class _Status:
    """A task status that remembers whether the service reported itself started."""

    def __init__(self, outer: anyio.abc.TaskStatus[Any] | None) -> None:
        self.outer, self.done = outer, False

    def started(self, value: Any = None) -> None:
        self.done = True
        if self.outer is not None:
            self.outer.started(value)
            self.outer = None


class Supervisor:
    """Runs services, each restarted after an unexpected end; their state in `states`."""

    def __init__(self, states: ServiceStates, config: SuperviseConfig | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.states, self.config, self.clock = states, config or SuperviseConfig(), clock

    async def run(self, name: str, service: Service) -> None:
        """Run `service()` forever under the name `name` (a task of a task group)."""
        async def started(*, task_status: _Status) -> None:
            task_status.started()
            await service()
        await self.run_started(name, started)

    async def run_started(self, name: str, service: StartedService, *,
                          task_status: anyio.abc.TaskStatus[Any] = anyio.TASK_STATUS_IGNORED
                          ) -> None:
        """Like `run` for a service that reports when it is up (`task_group.start`): the
        first run's value is passed on; a failure before the first report propagates."""
        status = _Status(task_status)
        backoff = self.config.first_backoff_s
        try:
            while True:
                began = self.clock()
                self.states.started(name)
                try:
                    await service(task_status=status)
                    error = "returned"  # a service runs until cancelled: ending is a failure
                except Exception as exc:
                    if not status.done:
                        raise  # it never started: a start error, the caller's to report
                    error = failure_text(exc)
                    log.debug("background service %s failed", name, exc_info=exc)
                if self.clock() - began >= self.config.stable_after_s:
                    backoff = self.config.first_backoff_s
                self.states.failed(name, shown(error))
                log.error("background service %s failed (%s): restarting in %g s",
                          name, shown(error), backoff)
                await anyio.sleep(backoff)
                backoff = min(backoff * 2, self.config.max_backoff_s)
        finally:
            self.states.stopped(name)

