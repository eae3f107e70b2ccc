"""Cached tokens are tokens of their own (issue 35): read from OpenAI's
`prompt_tokens_details.cached_tokens` and Anthropic's `cache_read_input_tokens` /
`cache_creation_input_tokens` (JSON answers and streams), kept in the ledger and /v1/usage,
priced at `price_cached_in` / `price_cache_write`, and returned in the client's API's own
usage shape; a `cache_control` block sent to an OpenAI-compatible upstream causes no 400."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from meshroute_middleware.core.clients_budget import (
    DAY_S,
    USAGE,
    ClientGates,
    Spent,
    cost_usd,
    usage_report,
)
from meshroute_middleware.core.providers.config import parse_providers_config
from meshroute_middleware.forwarding.measure import TokenMeter

from ..conftest import FakeClock
from .fake_anthropic import FakeAnthropic
from .fake_provider import FakeProvider, Reply
from .test_client_spend import H_TEST_CLIENT, make_client, priced_doc, served

PRICE_IN, PRICE_OUT, PRICE_CACHED, PRICE_WRITE = 2.0, 8.0, 0.2, 2.5  # USD per Mtok


def cached_doc(fast: FakeProvider, slow: FakeProvider) -> dict[str, Any]:
    """fastco/big-model priced at PRICE_IN / PRICE_OUT with a cache read price."""
    doc = priced_doc(fast, slow)
    doc["providers"][0]["models"][0].update(context=1_000_000, price_cached_in=PRICE_CACHED)
    return doc


# -- the meter -----------------------------------------------------------------------------

def metered(streaming: bool, *chunks: bytes) -> TokenMeter:
    meter = TokenMeter(streaming=streaming)
    for chunk in chunks:
        meter.feed(chunk)
    return meter


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data).encode() + b"\n\n"


OPENAI_USAGE = {"prompt_tokens": 1000, "completion_tokens": 8, "total_tokens": 1008,
                "prompt_tokens_details": {"cached_tokens": 900}}
ANTHROPIC_START = {"type": "message_start", "message": {"usage": {
    "input_tokens": 12, "cache_read_input_tokens": 300, "cache_creation_input_tokens": 50,
    "output_tokens": 1}}}
ANTHROPIC_END = {"type": "message_delta", "usage": {"output_tokens": 4}}


@pytest.mark.parametrize("streaming", [False, True])
def test_the_meter_reads_openais_cached_tokens(streaming: bool) -> None:
    if streaming:
        meter = metered(True, sse({"choices": [{"delta": {"content": "a"}}]}),
                        sse({"choices": [], "usage": OPENAI_USAGE}))
    else:
        meter = metered(False, json.dumps({"choices": [], "usage": OPENAI_USAGE}).encode())
    assert (meter.prompt_tokens, meter.cached_tokens, meter.cache_write_tokens,
            meter.completion_tokens) == (1000, 900, 0, 8)


@pytest.mark.parametrize("streaming", [False, True])
def test_the_meter_counts_an_anthropic_prompt_as_input_reads_and_writes(
        streaming: bool) -> None:
    if streaming:
        meter = metered(True, b"event: message_start\n" + sse(ANTHROPIC_START),
                        b"event: message_delta\n" + sse(ANTHROPIC_END))
    else:
        meter = metered(False, json.dumps({"content": [], "usage": {
            **ANTHROPIC_START["message"]["usage"], "output_tokens": 4}}).encode())  # type: ignore[index]
    assert (meter.prompt_tokens, meter.cached_tokens, meter.cache_write_tokens,
            meter.completion_tokens) == (12 + 300 + 50, 300, 50, 4)


def test_a_meter_without_cache_fields_reads_zero() -> None:
    meter = metered(False, b'{"usage": {"input_tokens": 7, "output_tokens": 2}}')
    assert (meter.prompt_tokens, meter.cached_tokens, meter.cache_write_tokens) == (7, 0, 0)


# -- prices --------------------------------------------------------------------------------

def test_cache_prices_default_to_the_input_price_and_the_cost_is_their_sum() -> None:
    doc = {"providers": [{"name": "p", "base_url": "http://127.0.0.1:1/v1", "keys": ["env:K"],
                          "models": [{"id": "a", "tier": "large", "price_in": 3.0},
                                     {"id": "b", "tier": "large", "price_in": 3.0,
                                      "price_cached_in": 0.3, "price_cache_write": 3.75}]}]}
    a, b = parse_providers_config(doc).providers[0].models
    assert a.cache_prices == (3.0, 3.0) and b.cache_prices == (0.3, 3.75)
    got = cost_usd(1000, 10, (3.0, 15.0), 600, 300, b.cache_prices)
    assert got == pytest.approx((100 * 3.0 + 600 * 0.3 + 300 * 3.75 + 10 * 15.0) / 1e6)
    assert cost_usd(1000, 10, (3.0, 15.0), 600, 300, a.cache_prices) == \
        pytest.approx(cost_usd(1000, 10, (3.0, 15.0)))
    bad = {**doc, "providers": [{**doc["providers"][0], "models": [
        {"id": "c", "tier": "large", "price_cached_in": -1}]}]}
    with pytest.raises(ValueError, match="price_cached_in"):
        parse_providers_config(bad)


# -- through a gateway ---------------------------------------------------------------------

def test_an_openai_upstreams_cached_tokens_are_kept_and_priced(
        providers: tuple[FakeProvider, FakeProvider], clock: FakeClock) -> None:
    """A JSON answer and a stream (usage asked by the gateway), each 1000 prompt tokens of
    which 900 were cached: /v1/usage shows 1800 cached, the cost is the three prices' sum,
    and the metrics count the cached kind."""
    fast, slow = providers
    fast.default = Reply.ok(tokens=8, prompt_tokens=1000, cached_tokens=900, asked_usage=True)
    with served(cached_doc(fast, slow), [make_client("alice")], clock) as gw:
        whole = gw.chat("alice", stream=False)
        streamed = gw.chat("alice", stream=True)
        rows = gw.usage(group_by="client,route")
        counted = dict(gw.gateway.spend.counters.tokens)
    assert whole.status_code == 200 and streamed.status_code == 200
    assert whole.json()["usage"]["prompt_tokens_details"] == {"cached_tokens": 900}
    assert [(r["route"], r["requests"], r["prompt_tokens"], r["cached_tokens"],
             r["cache_write_tokens"], r["completion_tokens"]) for r in rows] == \
        [("fastco/big-model", 2, 2000, 1800, 0, 16)]
    one = (100 * PRICE_IN + 900 * PRICE_CACHED + 8 * PRICE_OUT) / 1e6
    assert rows[0]["cost_usd"] == pytest.approx(2 * one)
    assert rows[0]["cost_usd"] < 2 * (1000 * PRICE_IN + 8 * PRICE_OUT) / 1e6
    assert counted[("alice", "fastco/big-model", "cached")] == 1800
    assert counted[("alice", "fastco/big-model", "prompt")] == 2000
    assert ("alice", "fastco/big-model", "cache_write") not in counted


@pytest.fixture
def claude() -> Iterator[FakeAnthropic]:
    fake = FakeAnthropic(input_tokens=12, output_tokens=4, cache_read=300, cache_write=50)
    with fake.serve():
        yield fake


def claude_doc(claude: FakeAnthropic, fast: FakeProvider,
               slow: FakeProvider) -> dict[str, Any]:
    doc = priced_doc(fast, slow)
    doc["providers"].append({"name": "claudeco", "base_url": claude.base_url,
                             "keys": ["env:SLOW_A"],
                             "models": [{"id": "claude-real", "tier": "frontier",
                                         "api": "anthropic", "price_in": 3.0,
                                         "price_out": 15.0, "price_cached_in": 0.3,
                                         "price_cache_write": PRICE_WRITE}]})
    return doc


def test_an_anthropic_upstreams_cache_reads_and_writes_reach_an_openai_client(
        claude: FakeAnthropic, providers: tuple[FakeProvider, FakeProvider],
        clock: FakeClock) -> None:
    """An OpenAI client behind a Messages upstream: the prompt is input + cache reads +
    cache writes (12 + 300 + 50), reads are prompt_tokens_details.cached_tokens, and the
    ledger holds and prices each part."""
    fast, slow = providers
    with served(claude_doc(claude, fast, slow), [make_client("alice")], clock) as gw:
        api = openai.OpenAI(base_url=f"{gw.url}/v1", api_key="unused", max_retries=0,
                            default_headers={H_TEST_CLIENT.decode(): "alice"}).chat.completions
        whole = api.create(model="claudeco/claude-real", messages=[{"role": "user",
                                                                   "content": "hi"}])
        chunks = list(api.create(model="claudeco/claude-real", stream=True,
                                 stream_options={"include_usage": True},
                                 messages=[{"role": "user", "content": "hi"}]))
        rows = gw.usage(group_by="route")
    last = chunks[-1].usage
    for usage in (whole.usage, last):
        assert usage is not None and usage.prompt_tokens == 362
        assert usage.prompt_tokens_details is not None
        assert usage.prompt_tokens_details.cached_tokens == 300
    assert [(r["route"], r["prompt_tokens"], r["cached_tokens"], r["cache_write_tokens"],
             r["completion_tokens"]) for r in rows] == \
        [("claudeco/claude-real", 724, 600, 100, 8)]
    one = (12 * 3.0 + 300 * 0.3 + 50 * PRICE_WRITE + 4 * 15.0) / 1e6
    assert rows[0]["cost_usd"] == pytest.approx(2 * one)


def messages_client(url: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key="unused", max_retries=0,
                               default_headers={H_TEST_CLIENT.decode(): "alice"})


CACHED_SYSTEM: Any = [{"type": "text", "text": "you are terse " * 50,
                       "cache_control": {"type": "ephemeral"}}]
CACHED_TURN: Any = [{"role": "user", "content": [
    {"type": "text", "text": "hi", "cache_control": {"type": "ephemeral"}}]}]
CACHED_TOOL: Any = {"name": "weather", "description": "the weather",
                    "input_schema": {"type": "object", "properties": {}},
                    "cache_control": {"type": "ephemeral"}}


def test_a_messages_client_behind_an_openai_upstream_gets_cache_read_input_tokens(
        providers: tuple[FakeProvider, FakeProvider], clock: FakeClock) -> None:
    """The anthropic SDK with cache_control blocks (system, a turn, a tool) against an
    OpenAI-compatible upstream: no 400, nothing of cache_control reaches the upstream, the
    answer's usage is Messages' (`input_tokens` the uncached part, `cache_read_input_tokens`
    the cached one), JSON and streamed, and the ledger counts it as any other."""
    fast, slow = providers
    fast.default = Reply.ok(tokens=8, prompt_tokens=1000, cached_tokens=900, asked_usage=True)
    with served(cached_doc(fast, slow), [make_client("alice")], clock) as gw:
        api = messages_client(gw.url).messages
        msg = api.create(model="fastco/big-model", max_tokens=64, system=CACHED_SYSTEM,
                         messages=CACHED_TURN)
        with api.stream(model="fastco/big-model", max_tokens=64, system=CACHED_SYSTEM,
                        messages=CACHED_TURN) as stream:
            final = stream.get_final_message()
        rows = gw.usage()
        tooled = api.create(model="fastco/big-model", max_tokens=64, system=CACHED_SYSTEM,
                            messages=CACHED_TURN, tools=[CACHED_TOOL])  # the fake calls it
    assert tooled.stop_reason == "tool_use"
    for usage in (msg.usage, final.usage):
        assert (usage.input_tokens, usage.cache_read_input_tokens, usage.output_tokens) == \
            (100, 900, 8)
        assert usage.cache_creation_input_tokens == 0
    assert len(fast.seen) == 3
    for seen in fast.seen:
        assert "cache_control" not in json.dumps(seen.body)
    assert fast.seen[2].body["tools"][0]["function"]["name"] == "weather"
    assert [(r["prompt_tokens"], r["cached_tokens"], r["completion_tokens"]) for r in rows] \
        == [(2000, 1800, 16)]
    assert rows[0]["cost_usd"] == pytest.approx(
        2 * (100 * PRICE_IN + 900 * PRICE_CACHED + 8 * PRICE_OUT) / 1e6)


def test_ledger_rows_from_before_cached_tokens_read_zero_and_add_up() -> None:
    """A row a state file or Redis holds from before issue 35 has no cached fields: restored
    and reported as 0, and a new request's cached tokens add to it."""
    old = {"client": "alice", "route": "p/m", "day": 20_000, "requests": 2,
           "prompt_tokens": 30, "completion_tokens": 7, "cost_usd": 0.5, "errors": 0}
    assert usage_report([old], ("client",)) == [
        {"client": "alice", "requests": 2, "prompt_tokens": 30, "completion_tokens": 7,
         "cost_usd": 0.5, "errors": 0, "cached_tokens": 0, "cache_write_tokens": 0}]
    gates = ClientGates()
    gates.restore({USAGE: [{**old, "name": "alice p/m", "key": 20_000}]})
    gates.record("alice", Spent("p/m", 100, 3, 0.1, False, 80, 15), 20_000 * DAY_S + 5)
    [row] = gates.ledger()
    assert (row["requests"], row["prompt_tokens"], row["cached_tokens"],
            row["cache_write_tokens"]) == (3, 130, 80, 15)
