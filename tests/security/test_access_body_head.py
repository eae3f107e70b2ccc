"""The access log keeps a request body's head only (issue 32, row 8): a 13 MiB body of 480k
tiny items was held whole (appended chunk by chunk) and parsed on the event loop for its
`model` after it was refused, 374-462 ms of the loop's CPU that `/healthz` waited behind."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from meshroute_middleware.app import access
from meshroute_middleware.app.access import AccessRecord

from .test_body_shape_process import tiny_body

CHUNK = 64 * 1024  # what uvicorn hands on per receive


def record_of(body: bytes) -> AccessRecord:
    chunks = [body[i:i + CHUNK] for i in range(0, len(body), CHUNK)]

    async def receive() -> dict[str, Any]:
        chunk = chunks.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(chunks)}

    async def send(message: Any) -> None:
        return None

    record = AccessRecord({}, receive, send, lambda: 0.0)

    async def read_all() -> None:
        while chunks:
            await record.receive()
    asyncio.run(read_all())
    return record


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/responses"])
def test_a_large_bodys_model_is_read_from_its_head_without_holding_the_body(
        path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    record = record_of(tiny_body(path))
    assert len(record.body) <= 64 * 1024
    parsed: list[int] = []
    loads = access.orjson.loads

    def counted(data: Any) -> Any:
        parsed.append(len(data))
        return loads(data)
    monkeypatch.setattr(access.orjson, "loads", counted)
    assert record.model() == "m"
    assert max(parsed) < 300  # the model's string alone, not the body


def test_a_small_bodys_model_is_parsed_whole_and_a_model_past_the_head_is_not_guessed(
        ) -> None:
    assert record_of(b'{"messages": [], "model": "small"}').model() == "small"
    late = b'{"input": [' + b",".join([b'"x"'] * 100_000) + b'], "model": "late"}'
    assert record_of(late).model() is None
    escaped = b'{"model": "a\\"b", "input": [' + b",".join([b'"x"'] * 100_000) + b"]}"
    assert record_of(escaped).model() == 'a"b'
