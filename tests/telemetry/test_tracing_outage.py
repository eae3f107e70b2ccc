"""A collector that is down is logged once per outage and counted (issue 35): the SDK's
exporter logs a warning per retry of every batch; telemetry/otlp_export.py lets the first
line of an outage through, counts the rest, and probes an absent collector every PROBE_S."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator, Sequence

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from meshroute_middleware.telemetry.otlp_export import (
    PROBE_S,
    SDK_LOGGER,
    CountedExporter,
    Outage,
)
from meshroute_middleware.telemetry.tracing import Tracing, _Trace

SPANS: Sequence[ReadableSpan] = (ReadableSpan("a"), ReadableSpan("b"))


class Collector(SpanExporter):
    """An SDK exporter double: down or up; while down, it logs on the SDK's logger as the
    OTLP/HTTP exporter does (a warning per retry, then an error)."""

    def __init__(self) -> None:
        self.up, self.calls = False, 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        if self.up:
            return SpanExportResult.SUCCESS
        sdk = logging.getLogger(SDK_LOGGER)
        for delay in (1.0, 2.0):
            sdk.warning("Transient error %s encountered while exporting spans batch, retrying "
                        "in %.2fs.", "Connection refused", delay)
        sdk.error("Failed to export spans batch due to timeout, max retries or shutdown.")
        return SpanExportResult.FAILURE


@pytest.fixture(autouse=True)
def sdk_logger_alone() -> Iterator[None]:
    """No other gateway's outage filter (an earlier test's, same process) on the SDK's logger."""
    sdk = logging.getLogger(SDK_LOGGER)
    others = [f for f in sdk.filters if isinstance(f, Outage)]
    for f in others:
        sdk.removeFilter(f)
    yield
    for f in others:
        sdk.addFilter(f)


def lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == level]


def test_an_outage_is_one_line_its_retries_are_counted_and_its_end_is_said(
        caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    collector = Collector()
    exporter = CountedExporter(collector, clock=lambda: now[0])
    sdk = logging.getLogger(SDK_LOGGER)
    sdk.addFilter(exporter.outage)
    try:
        with caplog.at_level(logging.INFO):
            for _ in range(4):  # four batches, PROBE_S apart: each one is tried
                assert exporter.export(SPANS) is SpanExportResult.FAILURE
                now[0] += PROBE_S
            collector.up = True
            assert exporter.export(SPANS) is SpanExportResult.SUCCESS
            collector.up = False
            exporter.export(SPANS)  # a second outage: one line again
    finally:
        sdk.removeFilter(exporter.outage)
    warnings = lines(caplog, logging.WARNING)
    assert len(warnings) == 2 and all("OTLP export failing" in w for w in warnings), warnings
    assert "Connection refused" in warnings[0] and "counted" in warnings[0]
    assert lines(caplog, logging.ERROR) == []
    assert lines(caplog, logging.INFO) == [
        "OTLP collector answers again: 4 exports failed, 8 spans lost, 11 export log lines "
        "not logged"]  # 4 batches x 3 lines, less the one logged
    assert (exporter.failures, exporter.spans_lost, exporter.outage.suppressed) == (5, 10, 13)


def test_each_outage_s_end_counts_its_own_losses(caplog: pytest.LogCaptureFixture) -> None:
    """The SDK's first retry line (logged inside the failing export) begins an outage: its
    end counts from that export, not from an earlier outage's start (the second recovery
    line said 5 exports and 10 spans, the first outage's included)."""
    now = [0.0]
    collector = Collector()
    exporter = CountedExporter(collector, clock=lambda: now[0])
    sdk = logging.getLogger(SDK_LOGGER)
    sdk.addFilter(exporter.outage)
    try:
        with caplog.at_level(logging.INFO):
            for outage in (3, 2):  # an outage of three batches, then one of two
                collector.up = False
                for _ in range(outage):
                    exporter.export(SPANS)
                    now[0] += PROBE_S
                collector.up = True
                exporter.export(SPANS)
                exporter.export(SPANS)  # up: no line
    finally:
        sdk.removeFilter(exporter.outage)
    assert lines(caplog, logging.INFO) == [
        "OTLP collector answers again: 3 exports failed, 6 spans lost, 8 export log lines "
        "not logged",
        "OTLP collector answers again: 2 exports failed, 4 spans lost, 5 export log lines "
        "not logged"]
    assert len(lines(caplog, logging.WARNING)) == 2


def test_while_the_collector_is_away_one_batch_per_probe_interval_is_sent() -> None:
    now = [0.0]
    collector = Collector()
    exporter = CountedExporter(collector, clock=lambda: now[0])
    for _ in range(10):  # ten batches within one probe interval: one is sent
        exporter.export(SPANS)
        now[0] += PROBE_S / 20
    assert collector.calls == 1 and exporter.spans_lost == 20
    now[0] = PROBE_S + 0.001
    collector.up = True
    assert exporter.export(SPANS) is SpanExportResult.SUCCESS and collector.calls == 2
    exporter.export(SPANS)  # up: every batch is sent
    assert collector.calls == 3 and not exporter.outage.down


def test_the_real_exporter_logs_one_line_for_a_down_collector(
        caplog: pytest.LogCaptureFixture) -> None:
    """The SDK's own OTLP/HTTP exporter to a loopback port nothing listens on: three
    batches, one warning line, the rest counted."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tracing = Tracing(f"http://127.0.0.1:{port}")
    try:
        with caplog.at_level(logging.INFO):
            for _ in range(3):
                _Trace(tracing, {"type": "http", "path": "/v1/chat/completions",
                                 "headers": [], "method": "POST"}).finish()
                tracing.flush(30)
    finally:
        tracing.shutdown()
    ours = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(ours) == 1 and "OTLP export failing" in ours[0].getMessage(), \
        [r.getMessage() for r in ours]
    assert tracing.exporter.failures == 3 and tracing.exporter.spans_lost == 3
    assert tracing.exporter.outage.suppressed >= 1
