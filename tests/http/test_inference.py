"""The embeddings and completions bodies: what is accepted, what each request carries."""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshroute_middleware.http.errors import RequestError
from meshroute_middleware.http.inference import (
    MAX_INPUTS,
    PARSERS,
    parse_completion,
    parse_embeddings,
)


def _body(**fields: Any) -> bytes:
    return json.dumps({"model": "m", **fields}).encode()


@pytest.mark.parametrize(("value", "inputs"), [
    ("one", 1), (["a", "b", "c"], 3), ([1, 2, 3], 1), ([[1], [2, 3]], 2),
    (["x"] * MAX_INPUTS, MAX_INPUTS)])
def test_an_embeddings_request_counts_its_inputs(value: Any, inputs: int) -> None:
    req = parse_embeddings(_body(input=value))
    assert (req.kind, req.inputs, req.needs, req.path) == (
        "embeddings", inputs, frozenset({"embeddings"}), "/v1/embeddings")


@pytest.mark.parametrize("value", ["", [], [""], [1, "a"], [[]], [-1], [True], [[1.5]],
                                   {"text": "a"}, None, ["x"] * (MAX_INPUTS + 1)])
def test_bad_inputs_are_400s(value: Any) -> None:
    with pytest.raises(RequestError) as info:
        parse_embeddings(_body(input=value))
    assert (info.value.status, info.value.code) == (400, "invalid_input")


def test_a_completions_request_is_bounded_and_carries_its_prompt_chain() -> None:
    req = parse_completion(_body(prompt="Once upon", max_tokens=12, stream=True,
                                 route=["n1"]))
    assert (req.kind, req.max_tokens, req.needs, req.pin, req.path) == (
        "completions", 12, frozenset({"completions"}), ["n1"], "/v1/completions")
    assert req.prefix is not None  # a returning prompt finds the route that served it
    assert b'"route"' not in req.body  # meshroute's own field never reaches a route
    assert parse_completion(_body(prompt=[[1, 2], [3]])).prefix is None


@pytest.mark.parametrize(("fields", "code"), [
    ({}, "invalid_prompt"), ({"prompt": 7}, "invalid_prompt"),
    ({"prompt": "x", "max_tokens": True}, "invalid_max_tokens"),
    ({"prompt": "x", "max_tokens": -3}, "invalid_max_tokens"),
    ({"prompt": "x", "stream": 1}, "invalid_stream")])
def test_bad_completions_are_400s(fields: dict[str, Any], code: str) -> None:
    with pytest.raises(RequestError) as info:
        parse_completion(_body(**fields))
    assert (info.value.status, info.value.code) == (400, code)


def test_chat_keeps_its_own_parser_and_kind() -> None:
    req = PARSERS["chat"](_body(messages=[{"role": "user", "content": "hi"}]))
    assert (req.kind, req.inputs, req.path) == ("chat", None, "/v1/chat/completions")
