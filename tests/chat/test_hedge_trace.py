"""A hedge's attempt span says `meshroute.mode = "hedge"` (issue 34): a mesh hedge's own
decision mode, and a provider chain's (whose spans are otherwise `exploit` then `fallback`)
from the `hedge` event published as the hedge starts."""

from __future__ import annotations

import pytest

from meshroute_middleware.telemetry.events import EventBus

pytest.importorskip("opentelemetry.sdk.trace")
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
    InMemorySpanExporter,
)

from meshroute_middleware.telemetry.tracing import Tracing, _Trace


def selected(signature: str, attempt: int, mode: str = "provider") -> dict[str, object]:
    return {"mode": mode, "signature": signature, "model": "fastco/big", "attempt": attempt,
            "head": "fastco", "objective": "throughput"}


def test_a_provider_hedge_span_says_hedge_and_its_fallbacks_do_not() -> None:
    tracing = Tracing("http://127.0.0.1:9", exporter=InMemorySpanExporter())
    trace = _Trace(tracing, {"path": "/v1/chat/completions", "headers": [],
                             "method": "POST"})
    bus = EventBus()
    bus.publish("route-selected", selected("fastco/big#1", 0))
    bus.publish("hedge", {"model": "auto", "signature": "fastco/other#1",
                          "after": "fastco/big#1"})
    bus.publish("route-selected", selected("fastco/other#1", 1))
    bus.publish("route-selected", selected("fastco/third#1", 2))
    for entry in bus.entries():
        trace(entry)
    tracing.shutdown()
    modes = {sig: span.attributes["meshroute.mode"] for (sig, _), span in trace.attempts.items()}
    assert modes == {"fastco/big#1": "exploit", "fastco/other#1": "hedge",
                     "fastco/third#1": "fallback"}
