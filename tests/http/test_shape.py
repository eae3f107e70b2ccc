"""A body's shape judged before it is parsed (issue 32): values and depth counted outside
strings, messages and content parts counted, which bodies are read at once."""

from __future__ import annotations

import json
from typing import Any

import pytest

from meshroute_middleware.http.errors import RequestError
from meshroute_middleware.http.request import check_large
from meshroute_middleware.http.shape import (
    INLINE_BYTES,
    MAX_JSON_DEPTH,
    BodyLimits,
    check_messages,
    scan,
    value_bound,
)


def values_of(body: bytes) -> int:
    """The values scan counts (1, and 1 per comma and per opening bracket outside strings:
    at least the values and members there are): the smallest max_values it lets through."""
    for limit in range(1, 100):
        try:
            scan(body, MAX_JSON_DEPTH, limit)
        except RequestError:
            continue
        return limit
    raise AssertionError("more than 99")


@pytest.mark.parametrize(("doc", "values"), [
    ({}, 2),
    ({"a": 1}, 2),
    ({"a": [1, 2, 3]}, 5),  # the root, a, and 3 elements
    ({"a": "x,y,[z],{w}"}, 2),  # commas and brackets in a string are text
    ({"a": 'say \\"hi, [there]\\"', "b": 2}, 3),  # escaped quotes do not end the string
    ({"a": "ends in a backslash \\", "b": [1, 2]}, 5),
    ([[], {}, [[]]], 8),
])
def test_values_are_counted_outside_strings(doc: Any, values: int) -> None:
    assert values_of(json.dumps(doc).encode()) == values


@pytest.mark.parametrize("doc", [{"a": [1, 2, 3]}, {"a": "x,y,[z],{w}"}, [[], {}, [[]]]])
def test_the_byte_count_bound_is_never_below_the_scan(doc: Any) -> None:
    body = json.dumps(doc).encode()
    assert value_bound(body) >= values_of(body)
    assert value_bound(body * 3000) >= 3000 * (values_of(body) - 1)  # counted a MiB at a time


def test_too_many_values_is_413_and_the_scan_stops_there() -> None:
    body = b"[" + b",".join([b"1"] * 1000) + b"]"
    with pytest.raises(RequestError) as got:
        scan(body, MAX_JSON_DEPTH, 500)
    assert (got.value.status, got.value.code) == (413, "too_many_values")
    scan(body, MAX_JSON_DEPTH, 1001)


@pytest.mark.parametrize("depth", [MAX_JSON_DEPTH + 1, 20_000])
def test_too_deep_is_400_invalid_json(depth: int) -> None:
    with pytest.raises(RequestError) as got:
        scan(b"[" * depth + b"]" * depth, MAX_JSON_DEPTH)
    assert (got.value.status, got.value.code) == (400, "invalid_json")
    scan(b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH, MAX_JSON_DEPTH)
    scan(b'["' + b"[" * depth + b'"]', MAX_JSON_DEPTH)  # inside a string: text


def chat(messages: list[Any]) -> dict[str, Any]:
    return {"model": "m", "messages": messages}


@pytest.mark.parametrize(("payload", "code"), [
    (chat([{"role": "user", "content": "x"}] * 4), "too_many_messages"),
    ({"model": "m", "input": [{"role": "user", "content": "x"}] * 4}, "too_many_messages"),
    (chat([{"role": "user", "content": [{"type": "text", "text": "x"}] * 3}] * 2),
     "too_many_content_parts"),
])
def test_messages_and_parts_past_their_limits_are_413(payload: dict[str, Any],
                                                     code: str) -> None:
    limits = BodyLimits(max_messages=3, max_content_parts=5)
    with pytest.raises(RequestError) as got:
        check_messages(payload, limits)
    assert (got.value.status, got.value.code) == (413, code)
    with pytest.raises(RequestError):  # the same through the large body's whole check
        check_large(json.dumps(payload).encode(), limits)
    check_messages(payload, BodyLimits(max_messages=4, max_content_parts=6))


def test_a_body_is_read_at_once_only_when_no_limit_can_be_passed() -> None:
    assert BodyLimits().inline(b"x" * INLINE_BYTES)
    assert not BodyLimits().inline(b"x" * (INLINE_BYTES + 1))
    small = BodyLimits(max_messages=10)  # 20 bytes hold at most 10 values
    assert small.inline(b"x" * 18) and not small.inline(b"x" * 19)


@pytest.mark.parametrize("field", ["max_messages", "max_content_parts", "max_json_values"])
def test_limits_are_positive(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        BodyLimits(**{field: 0})
