"""The chat request parser under hostile bodies: a ChatRequest or a RequestError, nothing else."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as hs

from meshroute_middleware.http.request import ChatRequest, RequestError, parse_chat, read_body

from .strategies import FUZZ, JSON

pytestmark = pytest.mark.anyio

BODIES = (hs.binary(max_size=300)
          | JSON.map(lambda v: json.dumps(v).encode())
          | hs.fixed_dictionaries({"model": JSON}, optional={"route": JSON, "messages": JSON,
                                                            "stream": JSON})
          .map(lambda v: json.dumps(v).encode())
          | hs.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass")))


def _check(body: bytes) -> None:
    try:
        req = parse_chat(body)
    except RequestError as exc:
        assert exc.status == 400 and exc.code.startswith("invalid_"), exc.code
        assert str(exc) and "Traceback" not in str(exc)
        return
    assert isinstance(req, ChatRequest)
    assert isinstance(req.model, str) and req.model
    assert req.pin is None or (req.pin and all(isinstance(p, str) and p for p in req.pin))
    if req.pin is not None:  # the forwarded body is valid JSON without meshroute's field
        assert "route" not in json.loads(req.body)


@FUZZ
@given(BODIES)
def test_parse_chat_answers_a_request_or_a_400(body: bytes) -> None:
    _check(body)


@FUZZ
@given(hs.binary(max_size=64), hs.integers(min_value=0, max_value=200))
def test_parse_chat_survives_truncation_of_a_valid_body(tail: bytes, cut: int) -> None:
    body = json.dumps({"model": "m", "route": ["a", "b"], "messages": [
        {"role": "user", "content": "hi"}]}).encode()
    _check(body[:cut] + tail)


@FUZZ
@given(hs.lists(hs.binary(max_size=40), max_size=6),
       hs.one_of(hs.none(), hs.binary(max_size=12)), hs.integers(min_value=1, max_value=120))
async def test_read_body_holds_to_its_limit(chunks: list[bytes], declared: bytes | None,
                                            limit: int) -> None:
    headers = [] if declared is None else [(b"content-length", declared)]
    messages: list[dict[str, Any]] = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks or [b""])]

    async def receive() -> Any:
        return messages.pop(0)

    try:
        body = await read_body({"headers": headers}, receive, limit)
    except RequestError as exc:
        assert exc.status in (400, 413)
        return
    assert len(body) <= limit and body == b"".join(chunks)
