"""The OpenAI-style error body every client-visible error carries."""

from __future__ import annotations

import json

from meshroute_middleware.core.contracts.error_body import (
    error_body,
    error_message,
    error_object,
    sse_error_event,
)


def test_error_body_has_message_type_code_and_extras() -> None:
    body = json.loads(error_body(503, "all routes failed", "no_route", attempts=[]))
    assert body == {"error": {"message": "all routes failed", "type": "server_error",
                              "code": "no_route", "attempts": []}}
    assert json.loads(error_body(404, "x", "model_not_found"))["error"]["type"] == \
        "not_found_error"
    assert json.loads(error_body(418, "x", "teapot"))["error"]["type"] == "server_error"


def test_the_emulator_shape_is_the_same_object() -> None:
    assert error_object("m", "PlanError", "invalid_request_error", param=None) == {
        "error": {"message": "m", "type": "invalid_request_error", "code": "PlanError",
                  "param": None}}


def test_sse_error_event_is_one_data_event() -> None:
    raw = sse_error_event("the head died")
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n") and raw.count(b"\n") == 2
    assert json.loads(raw[6:]) == {"error": {"message": "the head died",
                                             "type": "server_error", "code": "upstream_failed"}}


def test_error_message_reads_only_error_bodies() -> None:
    assert error_message(json.loads(error_body(502, "refused", "busy"))) == "refused"
    for other in (None, [], "x", {"error": "x"}, {"error": {"message": 3}}, {"data": {}}):
        assert error_message(other) is None
