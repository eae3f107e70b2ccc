"""Nodes that misbehave, over real sockets: one that never answers, one that answers garbage,
one that closes mid-body. The gateway falls back before the first byte, ends a started
answer visibly broken, records the failure, and never answers 500 or hangs."""

from __future__ import annotations

import json
import logging
import time

import httpx
import pytest

from ..app.test_serve_e2e import register, start_gateway
from ..conftest import FakeClock
from ..upstream import FakeChat, ServerThread
from .hostile import HostileServer, closes_mid_body, closes_mid_stream, garbage, silent

DEADLINE_S = 20.0  # no request may take longer (the first-byte timeout is 1 s)


def _row(url: str, head: str) -> dict[str, object]:
    rows = httpx.get(url + "/v1/routing").json()["models"]["m"]["candidates"]
    return next(r for r in rows if r["head"] == head)


@pytest.mark.parametrize(("behaviour", "error"), [(silent, "timeout"), (garbage, None)])
def test_a_bad_head_before_the_first_byte_falls_back(behaviour: object, error: str | None,
                                                     ) -> None:
    good = FakeChat("good", tokens=10)
    with HostileServer(behaviour) as bad, ServerThread(good.app()) as g:  # type: ignore[arg-type]
        server, gateway = start_gateway(clock=FakeClock())
        with server:
            register(server.url, "bad", bad.url, tps=500)  # the prior prefers it
            register(server.url, "good", g.url, tps=10)
            for stream in (False, True):
                started = time.monotonic()
                resp = httpx.post(server.url + "/v1/chat/completions", timeout=DEADLINE_S,
                                  json={"model": "m", "messages": [], "stream": stream})
                assert time.monotonic() - started < DEADLINE_S
                assert resp.status_code == 200, resp.text
                assert resp.headers["x-meshroute-route"] == "m|good[0-39]"
            assert bad.connections >= 1
            row = _row(server.url, "bad")
            assert row["failures"] >= 1 and row["samples"] == 0
            if error:
                assert row["last_error"] == error
            outcomes = [e for e in gateway.telemetry.events.history() if e["type"] == "outcome"]
            assert {e["head"] for e in outcomes if e["error"]} == {"bad"}


def test_a_head_closing_mid_stream_ends_with_an_sse_error_event() -> None:
    with HostileServer(closes_mid_stream) as bad:
        server, _gateway = start_gateway(clock=FakeClock())
        with server:
            register(server.url, "bad", bad.url)
            resp = httpx.post(server.url + "/v1/chat/completions", timeout=DEADLINE_S,
                              json={"model": "m", "messages": [], "stream": True})
            events = [e for e in resp.text.split("\n\n") if e.strip()]
            assert len(events) >= 2  # the relayed chunks, then the error
            last = json.loads(events[-1].removeprefix("data: "))
            assert last["error"]["code"] == "upstream_failed"
            assert _row(server.url, "bad")["failures"] == 1.0


def test_a_head_closing_mid_body_is_a_visible_failure(caplog: pytest.LogCaptureFixture) -> None:
    with HostileServer(closes_mid_body) as bad:
        server, _gateway = start_gateway(clock=FakeClock())
        with server:
            register(server.url, "bad", bad.url)
            try:
                resp = httpx.post(server.url + "/v1/chat/completions", timeout=DEADLINE_S,
                                  json={"model": "m", "messages": []})
            except httpx.TransportError:
                pass  # the client saw the answer break: fine
            else:  # or an error answer, never a 200 with a cut body passing as whole
                assert resp.status_code >= 500 and resp.json()["error"]["code"], resp.text
            row = _row(server.url, "bad")
            assert row["failures"] == 1.0 and row["samples"] == 0
    internal = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not internal, [r.getMessage() for r in internal]
