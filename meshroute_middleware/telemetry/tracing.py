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
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import Span, SpanKind, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from prometheus_client.core import CounterMetricFamily, Metric
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from meshroute_middleware.core.clients import CLIENT_STATE, Client
from meshroute_middleware.core.providers.chain import SESSION_HEADER
from meshroute_middleware.telemetry.events import TAP, Entry, materialize

log = logging.getLogger("meshroute.tracing")
TRACES_PATH = "/v1/traces"  # OTLP/HTTP's signal path under a base endpoint
EXPORT_TIMEOUT_S = 5.0  # one export's bound (the exporter's thread waits, never a request)
MAX_BODY = 1 << 20  # bytes of a request or a JSON answer read for model, usage and content
MAX_CONTENT = 64 * 1024  # characters of --otlp-content per attribute
_PROPAGATOR = TraceContextTextMapPropagator()
_TRACE_HEADERS = frozenset({b"traceparent", b"tracestate"})
_SESSION = SESSION_HEADER.encode()


def traces_url(endpoint: str) -> str:
    """The OTLP/HTTP traces URL of `endpoint`, a base URL (as OTEL_EXPORTER_OTLP_ENDPOINT
    is) or the full `/v1/traces` URL."""
    base = endpoint.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def parse_headers(text: str | None) -> dict[str, str]:
    """OTEL_EXPORTER_OTLP_HEADERS' form: `name=value,name=value`, values URL-encoded."""
    from urllib.parse import unquote
    out: dict[str, str] = {}
    for part in (text or "").split(","):
        name, eq, value = part.partition("=")
        if eq and name.strip():
            out[unquote(name.strip()).lower()] = unquote(value.strip())
    return out


def operation(path: str) -> str:
    """gen_ai.operation.name of a routed path."""
    if path.endswith("/embeddings"):
        return "embeddings"
    if path == "/v1/completions":
        return "text_completion"
    return "chat"


class CountedExporter(SpanExporter):
    """An exporter that counts what failed (an unreachable collector, a refusal)."""

    def __init__(self, inner: SpanExporter) -> None:
        self.inner = inner
        self.failures = 0  # export calls that failed
        self.spans_lost = 0  # spans in them

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception:  # an exporter's bug must not stop the batch thread
            log.exception("OTLP export raised")
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self.failures += 1
            self.spans_lost += len(spans)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class Tracing:
    """The tracer provider of one gateway, its batch exporter and its failure counts."""

    def __init__(self, endpoint: str, headers: Mapping[str, str] | None = None,
                 service_name: str = "meshroute", content: bool = False,
                 exporter: SpanExporter | None = None) -> None:
        self.content = content
        self.exporter = CountedExporter(exporter or OTLPSpanExporter(
            endpoint=traces_url(endpoint), headers=dict(headers or {}),
            timeout=EXPORT_TIMEOUT_S))
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name}),
                                       shutdown_on_exit=True)
        self.provider.add_span_processor(BatchSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("meshroute")

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Export every ended span now (blocking: tests, shutdown)."""
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Export what is left and stop the exporter's thread."""
        self.provider.shutdown()

    def metric_families(self) -> Iterator[Metric]:
        """Failed exports, for /metrics (Telemetry.add_collector)."""
        yield CounterMetricFamily("meshroute_otlp_export_failures",
                                  "OTLP span exports that failed (the spans are lost)",
                                  value=self.exporter.failures)
        yield CounterMetricFamily("meshroute_otlp_spans_lost",
                                  "Spans in failed OTLP exports", value=self.exporter.spans_lost)


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


def _number(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


class _Trace:
    """One request's span, its attempts' spans, and what the answer said."""

    def __init__(self, tracing: Tracing, scope: Scope) -> None:
        self.tracing, self.scope = tracing, scope
        headers = {k.decode("latin-1"): v.decode("latin-1")
                   for k, v in scope.get("headers", ()) if k in _TRACE_HEADERS}
        self.operation = operation(scope["path"])
        self.span: Span = tracing.tracer.start_span(
            self.operation, context=_PROPAGATOR.extract(headers), kind=SpanKind.SERVER,
            attributes={"gen_ai.operation.name": self.operation,
                        "http.request.method": scope.get("method", ""),
                        "url.path": scope["path"]})
        self.context = set_span_in_context(self.span)
        self.session = next((v.decode("latin-1") for k, v in scope.get("headers", ())
                             if k == _SESSION), None)
        self.body = bytearray()
        self.attempts: dict[tuple[str, int], Span] = {}
        self.routes: list[str] = []
        self.hedged: set[str] = set()  # routes whose next attempt is a hedge
        self.current: Span | None = None  # the attempt being forwarded (its traceparent)
        self.objective: str | None = None
        self.chain: str | None = None
        self.provider: str | None = None
        self.status = 0
        self.streaming = False
        self.answer = bytearray()
        self.pending = b""  # a stream's unfinished line
        self.found: dict[str, Any] = {}  # model, usage, the answer's text (streams)
        self.text: list[str] = []
        self.raised: str | None = None

    # the routing events (events.TAP), in the request's context as they are published
    def __call__(self, entry: Entry) -> None:
        kind = entry[1]
        if kind == "hedge":  # the next attempt at this route is a hedge (chat/hedge.py)
            self.hedged.add(str(materialize(entry).get("signature", "")))
            return
        if kind not in ("route-selected", "outcome"):
            return
        event = materialize(entry)
        signature = str(event.get("signature", ""))
        attempt = _number(event.get("attempt")) or 0
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
        span = self.tracing.tracer.start_span(f"attempt {signature}", context=self.context,
                                              kind=SpanKind.CLIENT, attributes=attrs)
        self.attempts[(signature, attempt)] = self.current = span
        self.routes.append(signature)

    def _end(self, event: Payload, signature: str, attempt: int) -> None:
        span = self.attempts.pop((signature, attempt), None)
        if span is None:
            return
        result = str(event.get("result", ""))
        span.set_attribute("meshroute.outcome", result)
        if isinstance(event.get("ttfb_ms"), int | float):
            span.set_attribute("meshroute.ttfb_ms", float(event["ttfb_ms"]))
        if (tokens := _number(event.get("completion_tokens"))) is not None:
            span.set_attribute("gen_ai.usage.output_tokens", tokens)
        if event.get("error"):
            span.set_attribute("error.type", str(event["error"]))
            if result == "failure":
                span.set_status(StatusCode.ERROR)
        elif event.get("mode") == "provider":
            self.provider = str(event.get("head"))
        span.end()
        if span is self.current:
            self.current = None

    def upstream_headers(self) -> list[tuple[str, str]]:
        """The `traceparent` (and `tracestate`) an attempt sends upstream."""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=set_span_in_context(self.current or self.span))
        return list(carrier.items())

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
        if self.tracing.content and self.streaming:
            self.text.extend(_stream_text(obj))

    def finish(self) -> None:
        span = self.span
        request = _json(bytes(self.body))
        model = request.get("model") if isinstance(request.get("model"), str) else None
        if model:
            span.update_name(f"{self.operation} {model}")
            span.set_attribute("gen_ai.request.model", model)
        if not self.streaming:
            answer = _json(bytes(self.answer))
            self._take(answer)
            if self.tracing.content:
                self.text.extend(_answer_text(answer))
        if isinstance(self.found.get("model"), str):
            span.set_attribute("gen_ai.response.model", self.found["model"])
        for name, count in _usage(self.found.get("usage", {})).items():
            span.set_attribute(name, count)
        client = self.scope.get("state", {}).get(CLIENT_STATE)
        if isinstance(client, Client):
            span.set_attribute("meshroute.client", client.name)
        if self.session:
            span.set_attribute("gen_ai.conversation.id", self.session)
        for name, text in (("meshroute.objective", self.objective),
                           ("meshroute.chain", self.chain or model),
                           ("gen_ai.provider.name", self.provider)):
            if text:
                span.set_attribute(name, text)
        span.set_attribute("meshroute.attempted_routes", self.routes)
        span.set_attribute("http.response.status_code", self.status or 499)
        if self.tracing.content:
            span.set_attribute("gen_ai.input.messages", _content(request))
            span.set_attribute("gen_ai.output.messages", "".join(self.text)[:MAX_CONTENT])
        error = self.raised or (_error_type(bytes(self.answer), self.status)
                                if self.status >= 400 else None)
        if error:
            span.set_attribute("error.type", error)
        if self.raised or self.status >= 500:
            span.set_status(StatusCode.ERROR)
        for attempt in self.attempts.values():  # no outcome: the request ended first
            attempt.set_attribute("meshroute.outcome", "cancelled")
            attempt.end()
        span.end()


Payload = dict[str, Any]


def _json(body: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _usage(usage: Mapping[str, Any]) -> dict[str, int]:
    """gen_ai.usage.* of an OpenAI, Anthropic or Responses usage object."""
    out: dict[str, int] = {}
    inp = _number(usage.get("prompt_tokens"))
    if inp is None:
        inp = _number(usage.get("input_tokens"))
    outp = _number(usage.get("completion_tokens"))
    if outp is None:
        outp = _number(usage.get("output_tokens"))
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    cached = _number(details.get("cached_tokens")) if isinstance(details, dict) else None
    if cached is None:
        cached = _number(usage.get("cache_read_input_tokens"))
    written = _number(usage.get("cache_creation_input_tokens"))
    for name, value in (("gen_ai.usage.input_tokens", inp),
                        ("gen_ai.usage.output_tokens", outp),
                        ("gen_ai.usage.cache_read.input_tokens", cached),
                        ("gen_ai.usage.cache_creation.input_tokens", written)):
        if value is not None:
            out[name] = value
    return out


def _error_type(body: bytes, status: int) -> str:
    """An error answer's code (OpenAI's or Anthropic's shape), else its status."""
    error = _json(body).get("error")
    if isinstance(error, dict):
        code = error.get("code") or error.get("type")
        if isinstance(code, str) and code:
            return code
    return str(status)


def _content(request: Mapping[str, Any]) -> str:
    """The request's messages (or input, or prompt) as JSON, bounded."""
    for name in ("messages", "input", "prompt"):
        if name in request:
            return orjson.dumps(request[name]).decode()[:MAX_CONTENT]
    return ""


def _answer_text(answer: Mapping[str, Any]) -> Iterator[str]:
    for choice in answer.get("choices") or ():
        if isinstance(choice, dict):
            message = choice.get("message")
            if isinstance(message, dict) and isinstance(message.get("content"), str):
                yield message["content"]
            elif isinstance(choice.get("text"), str):
                yield choice["text"]
    for block in answer.get("content") or ():
        if isinstance(block, dict) and isinstance(block.get("text"), str):
            yield block["text"]


def _stream_text(event: Mapping[str, Any]) -> Iterator[str]:
    for choice in event.get("choices") or ():
        if isinstance(choice, dict):
            delta = choice.get("delta")
            if isinstance(delta, dict) and isinstance(delta.get("content"), str):
                yield delta["content"]
            elif isinstance(choice.get("text"), str):
                yield choice["text"]
    delta = event.get("delta")
    if isinstance(delta, dict) and isinstance(delta.get("text"), str):
        yield delta["text"]


def traced(app: ASGIApp, tracing: Tracing, paths: Iterable[str],
           add_collector: Callable[[Callable[[], Iterable[Metric]]], None]) -> Traced:
    """`app` traced, its failed exports on /metrics."""
    add_collector(tracing.metric_families)
    return Traced(app, tracing, paths)
