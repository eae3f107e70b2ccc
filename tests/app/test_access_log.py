"""Logs a team reads (issue 33): one `meshroute.access` line per request, `--log-format json`
for every line, routing events naming their client, a client's rpm refusal as a `rejected`
event, and the start line naming the limits store."""

from __future__ import annotations

import json
import logging
import signal
from pathlib import Path
from typing import cast

import anyio
import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from meshroute_middleware.app.access import ACCESS, AccessLog
from meshroute_middleware.app.config import GatewayConfig, limits_store_name
from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core.clients import parse_clients
from meshroute_middleware.telemetry.metrics import Telemetry

from ..upstream import FakeChat, ServerThread, serve_process

ALICE_KEY = "mr-alice-test-key-0123456789abcdef"
CONFIG = """
[[clients]]
name = "alice"
key = "env:ALICE_KEY"
rpm = 2
"""
HI = [{"role": "user", "content": "hi"}]


def _nodes(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps([{"node_id": "n1", "model": "m", "start": 0, "end": 0,
                                 "layers": 1, "url": url, "tps": 10.0}]))
    return path


def test_json_access_log_has_one_line_per_request_with_its_fields(tmp_path: Path) -> None:
    up = FakeChat(name="up", tokens=5)
    config = tmp_path / "meshroute.toml"
    config.write_text(CONFIG)
    log = tmp_path / "log"
    with ServerThread(up.app()) as head, serve_process(
            ["--nodes-file", str(_nodes(tmp_path, head.url)), "--config", str(config),
             "--log-format", "json", "--state-file", str(tmp_path / "state.db")], log,
            {"ALICE_KEY": ALICE_KEY}) as (url, proc):
        auth = {"authorization": f"Bearer {ALICE_KEY}"}
        answers = [httpx.post(f"{url}/v1/chat/completions", headers=auth, timeout=30,
                              json={"model": "m", "messages": HI, "stream": stream})
                   for stream in (False, True, False)]  # the third is over rpm 2
        httpx.get(f"{url}/healthz", timeout=30)  # no access line: not a routed request
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert [a.status_code for a in answers] == [200, 200, 429]
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    assert all({"ts", "level", "logger", "message"} <= set(line) for line in lines)
    access = [line for line in lines if line["logger"] == "meshroute.access"]
    assert len(access) == 3, access
    for line, status in zip(access, (200, 200, 429), strict=True):
        assert line["client"] == "alice" and line["model"] == "m", line
        assert line["status"] == status and isinstance(line["duration_ms"], int), line
        assert line["path"] == "/v1/chat/completions"
    assert [line["route"] for line in access[:2]] == ["m|n1[0-0]"] * 2, access
    assert all(line["attempts"] == 1 and line["ttfb_ms"] is not None for line in access[:2])
    assert all(line["completion_tokens"] == 5 for line in access[:2]), access
    assert access[2]["route"] is None and access[2]["error"] == "client_rate_limited"
    start = next(line for line in lines if line["message"].startswith("tracker "))
    assert f"limits store: state file {tmp_path / 'state.db'}" in start["message"]


@pytest.mark.parametrize("level", [logging.INFO, logging.WARNING])  # the access log on, off
def test_events_name_the_client_and_an_rpm_refusal_is_a_rejected_event(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, level: int) -> None:
    up = FakeChat(name="up", tokens=3)
    with ServerThread(up.app()) as head:
        settings = ServeSettings(mdns=False, state_file=":memory:",
                                 nodes_file=str(_nodes(tmp_path, head.url)),
                                 clients=parse_clients([
                                     {"name": "alice", "key": "env:ALICE_KEY", "rpm": 1}]))
        gw = build_gateway(GatewayConfig.build(settings, {"ALICE_KEY": ALICE_KEY}))
        with caplog.at_level(level, "meshroute.access"), ServerThread(gw.app) as srv:
            auth = {"authorization": f"Bearer {ALICE_KEY}"}
            codes = [httpx.post(f"{srv.url}/v1/chat/completions", headers=auth, timeout=30,
                                json={"model": "m", "messages": HI}).status_code
                     for _ in range(2)]
    assert codes == [200, 429]
    events = gw.telemetry.events.history()
    routed = [e for e in events if e["type"] in ("route-selected", "outcome")]
    assert routed and all(e["client"] == "alice" for e in routed), routed
    rejected = [e for e in events if e["type"] == "rejected"]
    assert len(rejected) == 1 and rejected[0]["client"] == "alice", rejected
    assert rejected[0]["source"] == "clients" and "client_rate_limited" in rejected[0]["reason"]
    lines = [r for r in caplog.records if r.name == "meshroute.access"]
    assert len(lines) == (2 if level == logging.INFO else 0), lines


@pytest.mark.parametrize(("store", "state", "name"), [
    (None, ":memory:", "memory"),
    (None, "/var/lib/m/state.db", "state file /var/lib/m/state.db"),
    ("redis://user:s3cret@10.0.0.3:6379/0", ":memory:", "redis://10.0.0.3:6379/0"),
    ("rediss://:s3cret@cache.example:6380/2", None, "rediss://cache.example:6380/2"),
])
def test_the_limits_store_is_named_without_its_password(store: str | None, state: str | None,
                                                        name: str) -> None:
    assert limits_store_name(ServeSettings(limits_store=store, state_file=state)) == name


@pytest.mark.parametrize("level", [logging.INFO, logging.WARNING])  # the access log on, off
def test_the_body_and_the_answer_are_read_only_for_a_line(
        caplog: pytest.LogCaptureFixture, level: int) -> None:
    """With clients configured a request keeps its record with the log off too (its events
    name the client), but nothing reads its body's head or its answer's tokens then: neither
    is copied."""
    body = json.dumps({"model": "m", "messages": HI}).encode()
    seen: dict[str, object] = {}

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        assert (await receive())["body"] == body
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b'{"choices": []}'})
        record = ACCESS.get()
        assert record is not None
        # with the log off the record (QuietRecord) has no body head or meter at all
        seen["body"], seen["meter"] = getattr(record, "body", b""), getattr(record, "meter", None)

    async def receive() -> Message:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: Message) -> None:
        pass

    logged = AccessLog(app, cast(Telemetry, None), ["/v1/chat/completions"],
                       clients=lambda: True)
    caplog.set_level(level, logger="meshroute.access")
    anyio.run(logged, {"type": "http", "path": "/v1/chat/completions"}, receive, send)
    if level == logging.INFO:
        assert seen["body"] == body and seen["meter"] is not None
        assert [r.access["model"] for r in caplog.records  # type: ignore[attr-defined]
                if r.name == "meshroute.access"] == ["m"]
    else:
        assert seen == {"body": b"", "meter": None}
