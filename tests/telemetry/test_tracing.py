"""OpenTelemetry traces (issue 35) into a real OTLP/HTTP receiver started here: a request's
GenAI span and its attempts, a fallback's two attempts, no key and no content in any attribute
(content only with --otlp-content), a collector that is down costs clients nothing and is
counted, an incoming traceparent is continued and an outgoing one sent upstream."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from meshroute_middleware.core.clients import parse_clients

from ..providers.fake_provider import FakeProvider, Reply
from ..providers.gateway import ENV, gateway, providers_doc
from ..upstream import FakeChat, ServerThread, free_port, serve_process

PATIENCE_S = 60.0  # for spans to arrive, on a loaded 2-core machine (never a speed bound)
CLIENT_KEY = "mr-alice-0123456789abcdef"
CLIENTS = parse_clients([{"name": "alice",
                          "key": "sha256:" + hashlib.sha256(CLIENT_KEY.encode()).hexdigest()}])
AUTH = {"authorization": f"Bearer {CLIENT_KEY}"}
SECRET_TEXT = "the-secret-question-42"
MESSAGES = [{"role": "user", "content": SECRET_TEXT}]


class Receiver:
    """An OTLP/HTTP traces receiver on 127.0.0.1: every span it got, attributes decoded."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []  # each export's HTTP headers
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # http.server's name for it
                body = self.rfile.read(int(self.headers["content-length"]))
                request = ExportTraceServiceRequest.FromString(body)
                with receiver.lock:
                    receiver.headers.append({k.lower(): v for k, v in self.headers.items()})
                    for resource in request.resource_spans:
                        service = {a.key: _value(a.value) for a in resource.resource.attributes}
                        for scoped in resource.scope_spans:
                            for span in scoped.spans:
                                receiver.spans.append(_span(span, service))
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def wait(self, count: int) -> list[dict[str, Any]]:
        deadline = time.monotonic() + PATIENCE_S
        while time.monotonic() < deadline:
            with self.lock:
                if len(self.spans) >= count:
                    return list(self.spans)
            time.sleep(0.05)
        raise AssertionError(f"{len(self.spans)} spans arrived, {count} expected")


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    return getattr(value, kind) if kind else None


def _span(span: Any, service: dict[str, Any]) -> dict[str, Any]:
    return {"name": span.name, "trace_id": span.trace_id.hex(), "span_id": span.span_id.hex(),
            "parent": span.parent_span_id.hex(), "kind": span.kind, "service": service,
            "attrs": {a.key: _value(a.value) for a in span.attributes}}


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    got = Receiver()
    got.thread.start()
    try:
        yield got
    finally:
        got.server.shutdown()
        got.server.server_close()


@pytest.fixture
def providers() -> Iterator[tuple[FakeProvider, FakeProvider]]:
    fast, slow = FakeProvider("fast"), FakeProvider("slow", models=("small-model",))
    with fast.serve(), slow.serve():
        yield fast, slow


def _request_span(spans: list[dict[str, Any]]) -> dict[str, Any]:
    found = [s for s in spans if s["attrs"].get("url.path") == "/v1/chat/completions"]
    assert len(found) == 1, spans
    return found[0]


def _attempts(spans: list[dict[str, Any]], request: dict[str, Any]) -> list[dict[str, Any]]:
    return sorted((s for s in spans if s["parent"] == request["span_id"]),
                  key=lambda s: s["attrs"]["meshroute.attempt"])


def _no_secret_in(spans: list[dict[str, Any]], *secrets: str) -> None:
    for span in spans:
        text = repr(span)
        for secret in secrets:
            assert secret not in text, (secret, span)


def test_request_span_has_the_genai_attributes_and_its_attempt(
        providers: tuple[FakeProvider, FakeProvider], receiver: Receiver) -> None:
    fast, slow = providers
    with gateway(providers_doc(fast, slow), clients=CLIENTS, otlp_endpoint=receiver.url,
                 otlp_service_name="gw-test") as gw:
        answer = httpx.post(f"{gw.url}/v1/chat/completions", headers={
            **AUTH, "x-session-id": "conv-7"}, timeout=30,
            json={"model": "auto", "messages": MESSAGES})
        assert answer.status_code == 200, answer.text
        spans = receiver.wait(2)
    request = _request_span(spans)
    attrs = request["attrs"]
    assert request["name"] == "chat auto"
    assert request["service"]["service.name"] == "gw-test"
    assert attrs["gen_ai.operation.name"] == "chat"
    assert attrs["gen_ai.request.model"] == "auto"
    assert attrs["gen_ai.response.model"] == answer.json()["model"]
    assert attrs["gen_ai.provider.name"] == "fastco"
    assert attrs["gen_ai.usage.input_tokens"] == answer.json()["usage"]["prompt_tokens"]
    assert attrs["gen_ai.usage.output_tokens"] == answer.json()["usage"]["completion_tokens"]
    assert attrs["gen_ai.conversation.id"] == "conv-7"
    assert attrs["meshroute.client"] == "alice"
    assert attrs["meshroute.chain"] == "auto"
    assert attrs["meshroute.objective"] == "throughput"
    assert attrs["meshroute.attempted_routes"] == [answer.headers["x-meshroute-route"]]
    assert "error.type" not in attrs
    (attempt,) = _attempts(spans, request)
    assert attempt["trace_id"] == request["trace_id"]
    a = attempt["attrs"]
    assert a["meshroute.route"] == "fastco/big-model"
    assert a["meshroute.key_position"] in (1, 2)
    assert a["meshroute.mode"] == "exploit"
    assert a["meshroute.outcome"] in ("success", "sample")
    assert a["meshroute.ttfb_ms"] >= 0
    # no key, no content: the provider keys, the client's key, the messages
    _no_secret_in(spans, *ENV.values(), CLIENT_KEY, SECRET_TEXT, "t0 t1")
    assert not any(k.startswith("gen_ai.input") or k.startswith("gen_ai.output")
                   for s in spans for k in s["attrs"])
    # the upstream got the attempt's traceparent: same trace, the attempt span its parent
    sent = fast.seen[-1].headers.get("traceparent", "")
    assert re.fullmatch(rf"00-{request['trace_id']}-{attempt['span_id']}-[0-9a-f]{{2}}", sent), sent


def test_a_fallback_shows_both_attempts(
        providers: tuple[FakeProvider, FakeProvider], receiver: Receiver) -> None:
    fast, slow = providers
    fast.push(Reply(status=500), Reply(status=500))  # both fastco keys fail: slowco answers
    with gateway(providers_doc(fast, slow), otlp_endpoint=receiver.url) as gw:
        answer = gw.chat("auto")
        assert answer.status_code == 200, answer.text
        spans = receiver.wait(2)
        request = _request_span(spans)
        routes = request["attrs"]["meshroute.attempted_routes"]
        receiver.wait(1 + len(routes))
    spans = list(receiver.spans)
    request = _request_span(spans)
    attempts = _attempts(spans, request)
    assert len(attempts) == len(routes) >= 2
    assert [a["attrs"]["meshroute.route.signature"] for a in attempts] == routes
    first, last = attempts[0]["attrs"], attempts[-1]["attrs"]
    assert first["meshroute.mode"] == "exploit" and first["meshroute.outcome"] == "failure"
    assert first["error.type"] == "http_5xx"
    assert last["meshroute.mode"] == "fallback" and last["meshroute.route"] == "slowco/small-model"
    assert last["meshroute.outcome"] in ("success", "sample")
    assert request["attrs"]["gen_ai.provider.name"] == "slowco"
    _no_secret_in(spans, *ENV.values())


def test_content_only_with_otlp_content(
        providers: tuple[FakeProvider, FakeProvider], receiver: Receiver) -> None:
    fast, slow = providers
    with gateway(providers_doc(fast, slow), otlp_endpoint=receiver.url,
                 otlp_content=True) as gw:
        answer = httpx.post(f"{gw.url}/v1/chat/completions", timeout=30,
                            json={"model": "auto", "messages": MESSAGES})
        assert answer.status_code == 200
        request = _request_span(receiver.wait(2))
    assert SECRET_TEXT in request["attrs"]["gen_ai.input.messages"]
    assert request["attrs"]["gen_ai.output.messages"] == \
        answer.json()["choices"][0]["message"]["content"]
    _no_secret_in(receiver.spans, *ENV.values())


def test_a_failed_request_has_an_error_type(
        providers: tuple[FakeProvider, FakeProvider], receiver: Receiver) -> None:
    fast, slow = providers
    with gateway(providers_doc(fast, slow), otlp_endpoint=receiver.url) as gw:
        answer = gw.chat("no-such-model")
        assert answer.status_code >= 400
        request = _request_span(receiver.wait(1))
    code = answer.json()["error"]["code"]
    assert request["attrs"]["error.type"] == code
    assert request["attrs"]["http.response.status_code"] == answer.status_code


def test_an_incoming_traceparent_is_continued(
        providers: tuple[FakeProvider, FakeProvider], receiver: Receiver) -> None:
    fast, slow = providers
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with gateway(providers_doc(fast, slow), otlp_endpoint=receiver.url) as gw:
        answer = gw.chat("auto", headers={"traceparent": f"00-{trace_id}-{parent}-01"},
                         stream=True)
        assert answer.status_code == 200
        spans = receiver.wait(2)
    request = _request_span(spans)
    assert request["trace_id"] == trace_id and request["parent"] == parent
    assert all(s["trace_id"] == trace_id for s in spans)
    assert request["attrs"]["gen_ai.usage.output_tokens"] == 8  # read from the stream


def test_a_collector_that_is_down_changes_nothing_for_clients_and_is_counted(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    down = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with gateway(providers_doc(fast, slow), otlp_endpoint=down) as gw:
        for _ in range(5):
            answer = gw.chat("auto")
            assert answer.status_code == 200, answer.text
        tracing = gw.gateway.app.tracing  # type: ignore[attr-defined]
        tracing.flush()
        deadline = time.monotonic() + PATIENCE_S
        while tracing.exporter.failures == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        metrics = httpx.get(f"{gw.url}/metrics", timeout=30).text
    assert tracing.exporter.failures >= 1
    found = re.search(r"^meshroute_otlp_export_failures_total (\S+)$", metrics, re.M)
    assert found is not None and float(found.group(1)) >= 1, metrics


def test_otlp_endpoint_without_the_extra_is_a_one_line_error() -> None:
    code = ("import sys; sys.modules['opentelemetry.sdk'] = None\n"
            "from meshroute_middleware.__main__ import main\n"
            "sys.exit(main(['serve', '--port', '0', '--no-mdns', "
            "'--otlp-endpoint', 'http://127.0.0.1:9']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "pip install 'meshroute[otlp]'" in lines[0], proc.stderr


def test_usage_attributes_of_each_shape() -> None:
    from meshroute_middleware.telemetry.genai import usage_attributes as _usage
    assert _usage({"prompt_tokens": 10, "completion_tokens": 3,
                   "prompt_tokens_details": {"cached_tokens": 8}}) == {
        "gen_ai.usage.input_tokens": 10, "gen_ai.usage.output_tokens": 3,
        "gen_ai.usage.cache_read.input_tokens": 8}
    assert _usage({"input_tokens": 2, "output_tokens": 5, "cache_read_input_tokens": 90,
                   "cache_creation_input_tokens": 7}) == {
        "gen_ai.usage.input_tokens": 2, "gen_ai.usage.output_tokens": 5,
        "gen_ai.usage.cache_read.input_tokens": 90,
        "gen_ai.usage.cache_creation.input_tokens": 7}
    assert _usage({}) == {}


def test_a_mesh_request_has_its_attempt_with_the_routers_mode(
        providers: tuple[FakeProvider, FakeProvider], receiver: Receiver) -> None:
    fast, slow = providers
    node = FakeChat("n1", tokens=6)
    with ServerThread(node.app()) as head, gateway(providers_doc(fast, slow),
                                                   otlp_endpoint=receiver.url) as gw:
        added = httpx.post(f"{gw.url}/v1/nodes", timeout=30, json={
            "node_id": "n1", "model": "qwen", "start": 0, "end": 39, "layers": 40,
            "url": head.url})
        assert added.status_code == 201
        answer = gw.chat("qwen")
        assert answer.status_code == 200, answer.text
        spans = receiver.wait(2)
    request = _request_span(spans)
    assert request["name"] == "chat qwen"
    (attempt,) = _attempts(spans, request)
    # the router's own word (no statistics yet, exploring off: its greedy pick)
    assert attempt["attrs"]["meshroute.mode"] in ("scout", "exploit", "greedy-fallback")
    assert attempt["attrs"]["meshroute.head"] == "n1"
    assert "meshroute.key_position" not in attempt["attrs"]
    assert node.seen[-1]["headers"]["traceparent"].split("-")[1] == request["trace_id"]


def test_meshroute_serve_takes_the_standard_otel_variables(receiver: Receiver,
                                                           tmp_path: Path) -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_SERVICE_NAME": "svc-env",
           "OTEL_EXPORTER_OTLP_HEADERS": "x-tenant=team%20a"}
    with serve_process([], tmp_path / "log", env) as (url, _):
        answer = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                            json={"model": "nobody-serves-this", "messages": MESSAGES})
        assert answer.status_code == 404, answer.text
        request = _request_span(receiver.wait(1))
    assert request["service"]["service.name"] == "svc-env"
    assert request["name"] == "chat nobody-serves-this"
    assert request["attrs"]["error.type"] == answer.json()["error"]["code"]
    assert receiver.headers[0]["x-tenant"] == "team a"
