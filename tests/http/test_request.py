"""parse_chat: what is valid JSON does not depend on which parser read it."""

from __future__ import annotations

import json

import pytest

from meshroute_middleware.chat.intake import parse
from meshroute_middleware.core.providers.tokens import estimate
from meshroute_middleware.http.request import RequestError, parse_chat


@pytest.mark.parametrize("body", [
    b'{"model": "m", "temperature": NaN}',  # Python's json accepts it, orjson does not
    b'{"model": "m", "seed": 123456789012345678901234567890}',  # past 64 bits
    '{"model": "m", "messages": [{"role": "user", "content": "héllo ✓"}]}'.encode(),
])
def test_what_pythons_json_accepts_is_accepted(body: bytes) -> None:
    req = parse_chat(body)
    assert req.model == "m" and req.body == body  # forwarded as the client sent it


@pytest.mark.parametrize("body", [b"{not json", b"", b"\xff\xfe", b'{"model": "m"} trailing'])
def test_invalid_json_is_a_400(body: bytes) -> None:
    with pytest.raises(RequestError) as err:
        parse_chat(body)
    assert (err.value.status, err.value.code) == (400, "invalid_json")


def test_a_pin_is_stripped_and_the_rest_reencoded_faithfully() -> None:
    # orjson would read 2**70 as a float; the re-encoded body must still carry the integer.
    body = json.dumps({"model": "m", "route": ["a", "b"], "stream": True,
                       "seed": 2**70, "messages": [{"role": "user", "content": "ü"}]}).encode()
    req = parse_chat(body)
    assert req.pin == ["a", "b"]
    assert json.loads(req.body) == {"model": "m", "stream": True, "seed": 2**70,
                                    "messages": [{"role": "user", "content": "ü"}]}


@pytest.mark.parametrize("field", ["max_tokens", "max_completion_tokens"])
def test_a_huge_bound_is_read_as_the_largest_one_and_forwarded_as_sent(field: str) -> None:
    """Python's json reads a 4,000-digit integer; meshroute reads it as 2**20 (a float of it
    would overflow in the policy) and forwards the body unchanged."""
    huge = int("9" * 4000)
    body = b'{"model": "m", "messages": [], "%s": %s}' % (field.encode(), str(huge).encode())
    req = parse_chat(body)
    assert req.max_tokens == 1 << 20 and req.body == body
    assert parse_chat(b'{"model": "m", "max_tokens": 0}').max_tokens is None
    assert parse_chat(b'{"model": "m", "max_tokens": true}').max_tokens is None


def test_the_messages_give_the_prompt_chain_that_a_next_turn_extends() -> None:
    """Issue 26: the parsed request carries its messages' hash chain (no text) for the
    router; the next turn of the conversation shares it up to its new messages."""
    first = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    later = [*first, {"role": "assistant", "content": "hello"},
             {"role": "user", "content": "and now?"}]
    one = parse_chat(json.dumps({"model": "m", "messages": first}).encode()).prefix
    two = parse_chat(json.dumps({"model": "m", "messages": later}).encode()).prefix
    assert one is not None and two is not None
    assert two.hashes[:2] == one.hashes and len(two.hashes) == 4
    assert "be brief" not in repr(two)
    assert parse_chat(b'{"model": "m"}').prefix is None
    assert parse_chat(b'{"model": "m", "messages": "text"}').prefix is None


@pytest.mark.parametrize(("extra", "needs"), [
    ({}, set()),
    ({"messages": [{"role": "user", "content": [
        {"type": "text", "text": "x"},
        {"type": "image_url", "image_url": {"url": "http://i/x.png"}}]}]}, {"vision"}),
    ({"messages": [{"role": "user", "content": "describe image_url please"}]}, set()),
    ({"tools": [{"type": "function", "function": {"name": "f"}}]}, {"tools"}),
    ({"tools": []}, set()),
    ({"functions": [{"name": "f"}]}, {"tools"}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
     {"json_schema"}),
    ({"response_format": {"type": "json_object"}, "note": "json_schema"}, set()),
])
def test_what_a_request_needs(extra: dict[str, object], needs: set[str]) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **extra}
    assert parse_chat(json.dumps(body).encode()).needs == needs


# -- per-request objectives (issue 26) ---------------------------------------------------------

def test_without_an_objective_the_body_goes_on_as_sent() -> None:
    body = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}]}'
    req = parse_chat(body)
    assert req.objective == "throughput" and req.body == body


@pytest.mark.parametrize("objective", ["throughput", "ttft", "cost"])
def test_the_body_field_is_read_and_stripped(objective: str) -> None:
    body = json.dumps({"model": "m", "meshroute": {"objective": objective}, "route": ["a"],
                       "seed": 2**70, "messages": []}).encode()
    req = parse_chat(body)
    assert req.objective == objective and req.pin == ["a"]
    assert json.loads(req.body) == {"model": "m", "seed": 2**70, "messages": []}


@pytest.mark.parametrize("objective", [b"ttft", b"cost", b"throughput"])
def test_the_header_is_read(objective: bytes) -> None:
    body = b'{"model": "m", "messages": []}'
    req = parse_chat(body, objective)
    assert req.objective == objective.decode() and req.body == body


def test_the_body_wins_over_the_header_and_empty_options_keep_it() -> None:
    assert parse_chat(b'{"model": "m", "meshroute": {"objective": "cost"}}',
                      b"ttft").objective == "cost"
    req = parse_chat(b'{"model": "m", "meshroute": {}}', b"ttft")
    assert req.objective == "ttft" and json.loads(req.body) == {"model": "m"}


@pytest.mark.parametrize(("body", "header", "code", "says"), [
    (b'{"model": "m", "meshroute": {"objective": "fastest"}}', None, "invalid_objective",
     "'meshroute.objective' must be one of 'throughput', 'ttft', 'cost', got 'fastest'"),
    (b'{"model": "m", "meshroute": {"objective": 3}}', None, "invalid_objective",
     "got a JSON number"),
    (b'{"model": "m", "meshroute": {"objective": null}}', None, "invalid_objective",
     "got a JSON null"),
    (b'{"model": "m"}', b"TTFT", "invalid_objective",
     "the x-meshroute-objective header must be one of 'throughput', 'ttft', 'cost', got "
     "'TTFT'"),
    (b'{"model": "m"}', b"", "invalid_objective", "got ''"),
    (b'{"model": "m", "meshroute": "ttft"}', None, "invalid_request",
     "'meshroute' must be an object with only 'objective'"),
    (b'{"model": "m", "meshroute": {"objective": "ttft", "x": 1}}', None, "invalid_request",
     "'meshroute' must be an object with only 'objective'"),
])
def test_a_bad_objective_is_a_400_naming_the_allowed_values(
        body: bytes, header: bytes | None, code: str, says: str) -> None:
    with pytest.raises(RequestError) as err:
        parse_chat(body, header)
    assert (err.value.status, err.value.code) == (400, code)
    assert says in str(err.value)


def test_a_model_named_like_the_field_is_not_an_option() -> None:
    body = b'{"model": "meshroute", "messages": []}'
    req = parse_chat(body)
    assert req.objective == "throughput" and req.body == body


def test_the_token_estimate_is_made_only_when_a_client_admission_reads_it() -> None:
    body = b'{"model": "m", "max_tokens": 7, "messages": [{"role": "user", "content": "hello"}]}'
    counted = estimate(json.loads(body))
    assert parse_chat(body).tokens == counted
    assert parse_chat(body, count_tokens=False).tokens is None
    assert parse(body, None, "chat", None, None).tokens == counted
    assert parse(body, None, "chat", None, None, count_tokens=False).tokens is None
