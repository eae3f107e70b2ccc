"""The state of the gateway's supervised background services, as /healthz and /metrics show it.

Pure bookkeeping (app/supervise.py runs the services and reports here): a service is *up*
while it runs and *degraded* from an unexpected failure until it has been started again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

MAX_ERROR_CHARS = 200  # of a failure's text kept for /healthz


@dataclass(slots=True)
class ServiceState:
    """One service: whether it runs, how often it failed, the last failure."""

    up: bool = False
    failures: int = 0
    last_error: str = ""


class ServiceStates:
    """Every supervised service by name."""

    def __init__(self) -> None:
        self._states: dict[str, ServiceState] = {}

    def started(self, name: str) -> None:
        """`name` runs (again)."""
        self._states.setdefault(name, ServiceState()).up = True

    def failed(self, name: str, error: str) -> None:
        """`name` ended by an unexpected failure; it is degraded until started again."""
        state = self._states.setdefault(name, ServiceState())
        state.up = False
        state.failures += 1
        state.last_error = error[:MAX_ERROR_CHARS]

    def stopped(self, name: str) -> None:
        """`name` was stopped on purpose (shutdown): no longer reported."""
        self._states.pop(name, None)

    def degraded(self) -> dict[str, str]:
        """Services that are down after a failure, with their last error."""
        return {name: s.last_error for name, s in sorted(self._states.items()) if not s.up}

    def failures(self, name: str) -> int:
        """How often `name` failed so far."""
        state = self._states.get(name)
        return state.failures if state is not None else 0

    def metric_families(self) -> Iterator[Metric]:
        """meshroute_service_up{service} and meshroute_service_failures{service}."""
        up = GaugeMetricFamily("meshroute_service_up",
                               "1 while a background service runs, 0 while it is restarting",
                               labels=["service"])
        failures = CounterMetricFamily("meshroute_service_failures",
                                       "Unexpected failures of a background service (each is "
                                       "logged and the service restarted)",
                                       labels=["service"])
        for name, state in sorted(self._states.items()):
            up.add_metric([name], 1.0 if state.up else 0.0)
            failures.add_metric([name], state.failures)
        yield from (up, failures)
