"""OpenTelemetry traces of routed requests over OTLP/HTTP (issue 35; docs/observability.md).

Imported only when `--otlp-endpoint` is set (the `otlp` extra): unset, nothing of
OpenTelemetry is loaded and a request pays one context-variable read per routing event.

`Traced`, an ASGI wrapper, makes one SERVER span per routed request, named
`{gen_ai.operation.name} {gen_ai.request.model}` after the GenAI semantic conventions, and
continues an incoming `traceparent` (W3C trace context, the SDK's propagator). While the request
is served, `events.TAP` hands it every routing event the gateway publishes, as it is published
and in the request's own context (no subscriber queue, no request id needed): a
`route-selected` event opens a CLIENT child span for the attempt, its `outcome` closes it. The
forwarder asks the same tap for the `traceparent` it sends upstream (the attempt's span).

Never exported: any key (an attempt names its key by position, `#1`, as the events do), any
header, and, unless `--otlp-content`, any message content. Spans leave in a
BatchSpanProcessor's thread, off the request path; a failed export is counted
(`meshroute_otlp_export_failures_total`) and costs the requests nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import orjson
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import Decision
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    get_current_span,
)
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client.core import CounterMetricFamily, Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from meshroute_middleware.core.clients import CLIENT_STATE, Client
from meshroute_middleware.core.providers.chain import SESSION_HEADER
from meshroute_middleware.telemetry.events import TAP, Entry, materialize
from meshroute_middleware.telemetry.genai import (
    MAX_CONTENT,
    answer_text,
    content,
    error_type,
    json_object,
    number,
    operation,
    stream_text,
    traces_url,
    usage_attributes,
)
from meshroute_middleware.telemetry.genai import parse_headers as parse_headers  # the app's
from meshroute_middleware.telemetry.otlp_export import SDK_LOGGER, CountedExporter, Outage

log = logging.getLogger("meshroute.tracing")
EXPORT_TIMEOUT_S = 5.0  # one export's bound (the exporter's thread waits, never a request)
MAX_BODY = 1 << 20  # bytes of a request or a JSON answer read for model, usage and content
_PROPAGATOR = TraceContextTextMapPropagator()
_TRACE_HEADERS = frozenset({b"traceparent", b"tracestate"})
_SESSION = SESSION_HEADER.encode()
_ERROR, _UNSET = Status(StatusCode.ERROR), Status(StatusCode.UNSET)


class Tracing:
    """The tracer provider of one gateway, its batch exporter and its failure counts."""

    def __init__(self, endpoint: str, headers: Mapping[str, str] | None = None,
                 service_name: str = "meshroute", content: bool = False,
                 exporter: SpanExporter | None = None) -> None:
        self.content = content
        self.exporter = CountedExporter(exporter or OTLPSpanExporter(
            endpoint=traces_url(endpoint), headers=dict(headers or {}),
            timeout=EXPORT_TIMEOUT_S))
        sdk_log = logging.getLogger(SDK_LOGGER)
        for old in [f for f in sdk_log.filters if isinstance(f, Outage)]:
            sdk_log.removeFilter(old)  # a gateway built again (tests, reload): the newest
        sdk_log.addFilter(self.exporter.outage)
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}),
                                       shutdown_on_exit=True)
        self.processor = BatchSpanProcessor(self.exporter)
        self.provider.add_span_processor(self.processor)
        self.tracer = self.provider.get_tracer("meshroute")
        self._scope = InstrumentationScope("meshroute")

    def root(self, carrier: Mapping[str, str],
             name: str) -> tuple[SpanContext | None, SpanContext]:
        """A request's parent (an incoming `traceparent`'s, else None) and its own span's
        context, sampled as the provider's sampler says (parent-based by default)."""
        context = _PROPAGATOR.extract(carrier) if carrier else None
        parent: SpanContext | None = get_current_span(context).get_span_context()
        if parent is None or not parent.is_valid:
            parent = None
        ids = self.provider.id_generator
        trace_id = parent.trace_id if parent is not None else ids.generate_trace_id()
        sampled = self.provider.sampler.should_sample(context, trace_id, name, SpanKind.SERVER)
        flags = TraceFlags(TraceFlags.SAMPLED if sampled.decision is Decision.RECORD_AND_SAMPLE
                           else TraceFlags.DEFAULT)
        return parent, SpanContext(trace_id, ids.generate_span_id(), False, flags,
                                   sampled.trace_state)

    def child(self, parent: SpanContext) -> SpanContext:
        """A new span's context under `parent` (its trace, sampling and state)."""
        return SpanContext(parent.trace_id, self.provider.id_generator.generate_span_id(),
                           False, parent.trace_flags, parent.trace_state)

    def emit(self, span: _Open, parent: SpanContext | None) -> None:
        """An ended span, to the batch processor (which drops it unless sampled)."""
        self.processor.on_end(ReadableSpan(
            span.name, span.context, parent, self.provider.resource, span.attributes,
            kind=span.kind, status=_ERROR if span.error else _UNSET, start_time=span.start,
            end_time=time.time_ns(), instrumentation_scope=self._scope))

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Export every ended span now (blocking: tests, shutdown)."""
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Export what is left and stop the exporter's thread."""
        self.provider.shutdown()
        logging.getLogger(SDK_LOGGER).removeFilter(self.exporter.outage)

    def metric_families(self) -> Iterator[Metric]:
        """Failed exports, for /metrics (Telemetry.add_collector)."""
        yield CounterMetricFamily("meshroute_otlp_export_failures",
                                  "OTLP span exports that failed (the spans are lost)",
                                  value=self.exporter.failures)
        yield CounterMetricFamily("meshroute_otlp_spans_lost",
                                  "Spans in failed OTLP exports", value=self.exporter.spans_lost)
        yield CounterMetricFamily("meshroute_otlp_log_lines_suppressed",
                                  "The OTLP exporter's log lines held back during outages "
                                  "(one line per outage is logged)",
                                  value=self.exporter.outage.suppressed)


class Traced:
    """ASGI wrapper: a span per request on `paths`, its attempts from the routing events."""

    def __init__(self, app: ASGIApp, tracing: Tracing, paths: Iterable[str]) -> None:
        self.app, self.tracing, self.paths = app, tracing, frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, self._lifespan_send(send))
            return
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        request = _Trace(self.tracing, scope)
        token = TAP.set(request)

        async def receiving() -> Message:
            message = await receive()
            if message["type"] == "http.request":
                request.take_body(message.get("body", b""))
            return message

        async def sending(message: Message) -> None:
            request.take_answer(message)
            await send(message)
        try:
            await self.app(scope, receiving, sending)
        except BaseException as exc:
            request.raised = type(exc).__name__
            raise
        finally:
            TAP.reset(token)
            request.finish()

    def _lifespan_send(self, send: Send) -> Send:
        async def sending(message: Message) -> None:
            if message["type"] == "lifespan.shutdown.complete":  # what is left goes out
                await asyncio.to_thread(self.tracing.shutdown)
            await send(message)
        return sending


class _Open:
    """A span being recorded: built as plain data and handed to the batch processor whole
    when it ends (no SDK span object, lock or per-attribute check on the request path)."""

    __slots__ = ("attributes", "context", "error", "kind", "name", "start")

    def __init__(self, name: str, context: SpanContext, kind: SpanKind,
                 attributes: dict[str, Any]) -> None:
        self.name, self.context, self.kind, self.attributes = name, context, kind, attributes
        self.start = time.time_ns()
        self.error = False


class _Trace:
    """One request's span, its attempts' spans, and what the answer said."""

    def __init__(self, tracing: Tracing, scope: Scope) -> None:
        self.tracing, self.scope = tracing, scope
        carrier: dict[str, str] = {}
        self.session: str | None = None
        for k, v in scope.get("headers", ()):
            if k in _TRACE_HEADERS:
                carrier[k.decode("latin-1")] = v.decode("latin-1")
            elif k == _SESSION:
                self.session = v.decode("latin-1")
        self.operation = operation(scope["path"])
        self.parent, self.span = tracing.root(carrier, self.operation)
        self.attributes: dict[str, Any] = {"gen_ai.operation.name": self.operation,
                                           "http.request.method": scope.get("method", ""),
                                           "url.path": scope["path"]}
        self.started = time.time_ns()
        self.body = bytearray()
        self.attempts: dict[tuple[str, int], _Open] = {}
        self.routes: list[str] = []
        self.hedged: set[str] = set()  # routes whose next attempt is a hedge
        self.current: _Open | None = None  # the attempt being forwarded (its traceparent)
        self.objective: str | None = None
        self.chain: str | None = None
        self.provider: str | None = None
        self.status = 0
        self.streaming = False
        self.answer = bytearray()
        self.pending = b""  # a stream's unfinished line
        self.found: dict[str, Any] = {}  # model, usage, the answer's text (streams)
        self.text: list[str] = []
        self.kept = 0  # characters in self.text
        self.raised: str | None = None
        self.affinity: str | None = None  # provider-key affinity's verdict (ranking.kept)

    # the routing events (events.TAP), in the request's context as they are published
    def __call__(self, entry: Entry) -> None:
        kind = entry[1]
        if kind == "hedge":  # the next attempt at this route is a hedge (chat/hedge.py)
            self.hedged.add(str(materialize(entry).get("signature", "")))
            return
        if kind == "affinity":  # what provider-key affinity did for the attempt begun last
            self._affinity(entry[4])
            return
        if kind not in ("route-selected", "outcome"):
            return
        event = materialize(entry)
        signature = str(event.get("signature", ""))
        attempt = number(event.get("attempt")) or 0
        self.objective = event.get("objective") or self.objective
        self.chain = event.get("chain") or self.chain
        if kind == "route-selected":
            self._begin(event, signature, attempt)
        else:
            self._end(event, signature, attempt)

    def _begin(self, event: Payload, signature: str, attempt: int) -> None:
        mode, provider = str(event.get("mode", "")), event.get("mode") == "provider"
        if provider:  # a provider chain: its best-ranked route, then its fallbacks
            mode = "fallback" if attempt else "exploit"
        if signature in self.hedged:
            self.hedged.discard(signature)
            mode = "hedge"
        attrs: dict[str, Any] = {
            "gen_ai.operation.name": self.operation, "meshroute.route": str(event.get("model")),
            "meshroute.route.signature": signature, "meshroute.attempt": attempt,
            "meshroute.mode": mode, "meshroute.head": str(event.get("head"))}
        if provider:
            attrs["gen_ai.provider.name"] = str(event.get("head"))
            position = signature.rpartition("#")[2]
            if position.isdigit():
                attrs["meshroute.key_position"] = int(position)
        span = _Open(f"attempt {signature}", self.tracing.child(self.span), SpanKind.CLIENT,
                     attrs)
        self.attempts[(signature, attempt)] = self.current = span
        self.routes.append(signature)

    def _affinity(self, told: Payload) -> None:
        """`meshroute.affinity` on the attempt's span, and on the request's (its last
        attempt's: the one that answered, or the last tried)."""
        span = self.attempts.get((str(told.get("signature")), number(told.get("attempt")) or 0))
        value = str(told.get("affinity"))
        if span is not None:
            span.attributes["meshroute.affinity"] = value
        self.affinity = value

    def _end(self, event: Payload, signature: str, attempt: int) -> None:
        span = self.attempts.pop((signature, attempt), None)
        if span is None:
            return
        attrs = span.attributes
        result = str(event.get("result", ""))
        attrs["meshroute.outcome"] = result
        if isinstance(event.get("ttfb_ms"), int | float):
            attrs["meshroute.ttfb_ms"] = float(event["ttfb_ms"])
        if (tokens := number(event.get("completion_tokens"))) is not None:
            attrs["gen_ai.usage.output_tokens"] = tokens
        if event.get("error"):
            attrs["error.type"] = str(event["error"])
            span.error = result == "failure"
        elif event.get("mode") == "provider":
            self.provider = str(event.get("head"))
        self.tracing.emit(span, self.span)
        if span is self.current:
            self.current = None

    def upstream_headers(self) -> list[tuple[str, str]]:
        """The `traceparent` (and `tracestate`) an attempt sends upstream."""
        ctx = self.current.context if self.current is not None else self.span
        headers = [("traceparent",
                    f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}")]
        if ctx.trace_state:
            headers.append(("tracestate", ctx.trace_state.to_header()))
        return headers

    # the request and its answer, as they pass
    def take_body(self, chunk: bytes) -> None:
        if len(self.body) < MAX_BODY:
            self.body += chunk

    def take_answer(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            self.streaming = any(k == b"content-type" and v.startswith(b"text/event-stream")
                                 for k, v in message.get("headers", ()))
            return
        if message["type"] != "http.response.body":
            return
        chunk = message.get("body", b"")
        if not self.streaming:
            if len(self.answer) < MAX_BODY:
                self.answer += chunk
            return
        lines = (self.pending + chunk).split(b"\n")
        self.pending = lines.pop()[:MAX_BODY]
        for line in lines:
            if line.startswith(b"data:"):
                try:
                    self._take(orjson.loads(line[5:]))
                except orjson.JSONDecodeError:
                    continue

    def _take(self, obj: Any) -> None:
        """Model, usage and (for --otlp-content) text of one answer or one stream event."""
        if not isinstance(obj, dict):
            return
        for part in (obj, obj.get("message"), obj.get("response")):
            if not isinstance(part, dict):
                continue
            if isinstance(part.get("model"), str):
                self.found.setdefault("model", part["model"])
            if isinstance(part.get("usage"), dict):
                self.found["usage"] = {**self.found.get("usage", {}), **part["usage"]}
        if self.tracing.content and self.streaming and self.kept < MAX_CONTENT:
            pieces = list(stream_text(obj))
            self.text.extend(pieces)  # a long stream keeps only what the span can carry
            self.kept += sum(len(p) for p in pieces)

    def finish(self) -> None:
        attrs = self.attributes
        request = json_object(bytes(self.body))
        model = request.get("model") if isinstance(request.get("model"), str) else None
        name = self.operation
        if model:
            name = f"{self.operation} {model}"
            attrs["gen_ai.request.model"] = model
        if not self.streaming:
            answer = json_object(bytes(self.answer))
            self._take(answer)
            if self.tracing.content:
                self.text.extend(answer_text(answer))
        if isinstance(self.found.get("model"), str):
            attrs["gen_ai.response.model"] = self.found["model"]
        attrs.update(usage_attributes(self.found.get("usage", {})))
        client = self.scope.get("state", {}).get(CLIENT_STATE)
        if isinstance(client, Client):
            attrs["meshroute.client"] = client.name
        if self.session:
            attrs["gen_ai.conversation.id"] = self.session
        for key, text in (("meshroute.objective", self.objective),
                          ("meshroute.chain", self.chain or model),
                          ("gen_ai.provider.name", self.provider),
                          ("meshroute.affinity", self.affinity)):
            if text:
                attrs[key] = text
        attrs["meshroute.attempted_routes"] = tuple(self.routes)
        attrs["http.response.status_code"] = self.status or 499
        if self.tracing.content:
            attrs["gen_ai.input.messages"] = content(request)
            attrs["gen_ai.output.messages"] = "".join(self.text)[:MAX_CONTENT]
        error = self.raised or (error_type(bytes(self.answer), self.status)
                                if self.status >= 400 else None)
        if error:
            attrs["error.type"] = error
        for attempt in self.attempts.values():  # no outcome: the request ended first
            attempt.attributes["meshroute.outcome"] = "cancelled"
            self.tracing.emit(attempt, self.span)
        root = _Open(name, self.span, SpanKind.SERVER, attrs)
        root.start, root.error = self.started, bool(self.raised or self.status >= 500)
        self.tracing.emit(root, self.parent)


Payload = dict[str, Any]


def traced(app: ASGIApp, tracing: Tracing, paths: Iterable[str],
           add_collector: Callable[[Callable[[], Iterable[Metric]]], None]) -> Traced:
    """`app` traced, its failed exports on /metrics."""
    add_collector(tracing.metric_families)
    return Traced(app, tracing, paths)
