"""The OTLP exporter as the gateway runs it (issue 35; telemetry/tracing.py): failed exports
counted, one log line per collector outage, and no export work while the collector is away.

The OpenTelemetry SDK's OTLP/HTTP exporter logs a warning for every retry of every batch
while its collector is down (a few lines a second, for as long as the outage lasts). Here an
outage is logged once, when it begins (the SDK's first line, or ours when the SDK said
nothing); what the SDK says after that is counted (`meshroute_otlp_log_lines_suppressed`),
not logged; its end is one info line with the outage's counts. While the collector is away,
one batch per PROBE_S is sent to find out whether it is back; the others are dropped
unencoded and counted as lost, so an outage costs the exporter's thread almost nothing too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

log = logging.getLogger("meshroute.tracing")
# the SDK's OTLP/HTTP span exporter's logger (its retries' warnings)
SDK_LOGGER = "opentelemetry.exporter.otlp.proto.http.trace_exporter"
PROBE_S = 5.0  # while the collector is away, one batch this often finds out if it is back
_OUTAGE = ("OTLP export failing: %s (until the collector answers, export errors are counted, "
           "not logged: meshroute_otlp_export_failures_total)")


class Outage(logging.Filter):
    """A logging filter on the SDK's exporter logger: its first line of an outage passes
    (saying that the rest are counted), the others are counted, not logged."""

    def __init__(self) -> None:
        super().__init__()
        self._lock = threading.Lock()
        self.down = False
        self.suppressed = 0  # SDK lines not logged, over every outage
        self.in_outage = 0  # of them, in the current outage

    def filter(self, record: logging.LogRecord) -> bool:
        with self._lock:
            if self.down:
                self.suppressed += 1
                self.in_outage += 1
                return False
            self.down = True
        said = record.getMessage()
        record.msg, record.args = _OUTAGE, (said,)
        return True

    def begin(self, why: str) -> None:
        """An export failed: the outage's one line, unless the SDK's was it."""
        with self._lock:
            if self.down:
                return
            self.down = True
        log.warning(_OUTAGE, why)

    def end(self) -> int | None:
        """An export succeeded: the SDK lines the outage held back, None when none was on."""
        with self._lock:
            if not self.down:
                return None
            held, self.down, self.in_outage = self.in_outage, False, 0
            return held


class CountedExporter(SpanExporter):
    """An exporter that counts what failed (an unreachable collector, a refusal), logs each
    outage once and probes an absent collector every PROBE_S instead of sending every batch."""

    def __init__(self, inner: SpanExporter, clock: Callable[[], float] = time.monotonic,
                 probe_s: float = PROBE_S) -> None:
        self.inner, self.clock, self.probe_s = inner, clock, probe_s
        self.failures = 0  # export calls that failed (or were dropped while it was away)
        self.spans_lost = 0  # spans in them
        self.outage = Outage()
        self._tried = float("-inf")  # when a batch was last sent during an outage
        self._lost_at_start = (0, 0)  # (failures, spans lost) when the outage began

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        now = self.clock()
        if self.outage.down and now - self._tried < self.probe_s:
            return self._lost(spans)  # away: not even encoded
        self._tried = now
        if not self.outage.down:  # the baseline an outage this batch begins counts from
            # (taken before the export: the SDK's own first line, logged inside it, may be
            # what begins the outage)
            self._lost_at_start = (self.failures, self.spans_lost)
        try:
            result = self.inner.export(spans)
        except Exception:  # an exporter's bug must not stop the batch thread
            log.exception("OTLP export raised")
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            held = self.outage.end()
            if held is not None:
                failures, lost = self._lost_at_start
                log.info("OTLP collector answers again: %d exports failed, %d spans lost, %d "
                         "export log lines not logged", self.failures - failures,
                         self.spans_lost - lost, held)
            return result
        self.outage.begin("the collector did not take a batch")
        return self._lost(spans)

    def _lost(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.failures += 1
        self.spans_lost += len(spans)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)
