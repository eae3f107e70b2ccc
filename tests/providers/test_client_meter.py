"""Meter what is spent (issue 32), through a real gateway on a loopback port and fake
providers: streamed usage asked of every upstream (and the client's stream kept as it asked),
tools, tool calls and reasoning counted, each request's worst case held in flight, and a
client that hangs up charged its prompt."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ..conftest import FakeClock
from .fake_provider import FakeProvider, Reply
from .test_client_spend import PRICE_IN, PRICE_OUT, make_client, priced_doc, served

NO_CACHE = {"cached_tokens": 0, "cache_write_tokens": 0}  # nothing cached (issue 35)

BIG_CONTEXT = 1_000_000


def roomy_doc(fast: FakeProvider, slow: FakeProvider) -> dict[str, Any]:
    """The priced doc with a context that takes a large prompt."""
    doc = priced_doc(fast, slow)
    doc["providers"][0]["models"][0]["context"] = BIG_CONTEXT
    return doc


def wait_for(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    """Poll `condition` until it holds (a bound for a stuck gateway, not a timing check)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.05)


def events(text: str) -> list[Any]:
    return [json.loads(line[6:]) for line in text.splitlines()
            if line.startswith("data: {")]


def test_streamed_usage_is_asked_for_and_the_ledger_holds_the_providers_count(
        providers: tuple[FakeProvider, FakeProvider], clock: FakeClock) -> None:
    """3 streamed requests whose prompt the provider counts at 200k tokens, under
    `daily_tokens = 2000`: the first is served and settled with the provider's usage (it
    sends usage only when asked, as OpenAI does), the next two are refused."""
    fast, slow = providers
    fast.default = Reply.ok(tokens=8, prompt_tokens=200_000, asked_usage=True)
    with served(priced_doc(fast, slow), [make_client("alice", daily_tokens=2000)],
                clock) as gw:
        answers = [gw.chat("alice", stream=True) for _ in range(3)]
        rows = gw.usage()
    assert [a.status_code for a in answers] == [200, 429, 429]
    assert [a.json()["error"]["code"] for a in answers[1:]] == ["budget_exceeded"] * 2
    assert len(fast.seen) == 1
    assert fast.seen[0].body["stream_options"] == {"include_usage": True}
    # the client did not ask for usage: its stream carries none, and every token
    chunks = events(answers[0].text)
    assert all("usage" not in c and c["choices"] for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == \
        "".join(f"t{i} " for i in range(8))
    assert [(r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in rows] == \
        [(1, 200_000, 8)]
    assert rows[0]["cost_usd"] == (200_000 * PRICE_IN + 8 * PRICE_OUT) / 1e6


def test_a_client_that_asks_for_usage_gets_the_providers_chunk(
        providers: tuple[FakeProvider, FakeProvider], clock: FakeClock) -> None:
    fast, slow = providers
    fast.default = Reply.ok(tokens=3, prompt_tokens=41, asked_usage=True)
    with served(priced_doc(fast, slow), [make_client("alice")], clock) as gw:
        answer = gw.chat("alice", stream=True, stream_options={"include_usage": True})
        rows = gw.usage()
    chunks = events(answer.text)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"] == {
        "prompt_tokens": 41, "completion_tokens": 3, "total_tokens": 44}
    assert all("usage" in c for c in chunks)  # as the provider sent them: null until the last
    assert [(r["prompt_tokens"], r["completion_tokens"]) for r in rows] == [(41, 3)]


def test_a_prompt_hidden_in_tool_schemas_is_refused_by_its_estimate(
        providers: tuple[FakeProvider, FakeProvider], clock: FakeClock) -> None:
    """~200k tokens of tool schema under `daily_tokens = 2000`: nothing reaches the
    provider (before issue 32 the estimate saw 5 tokens and all three were served)."""
    fast, slow = providers
    tools = [{"type": "function", "function": {
        "name": f"f{i}", "description": "x" * 8000,
        "parameters": {"type": "object", "properties": {}}}} for i in range(100)]
    with served(roomy_doc(fast, slow), [make_client("alice", daily_tokens=2000)],
                clock) as gw:
        codes = [gw.chat("alice", stream=True, tools=tools).status_code for _ in range(3)]
    assert codes == [429, 429, 429]
    assert fast.seen == [] and slow.seen == []


def test_tool_call_and_reasoning_deltas_count_when_no_usage_comes(
        providers: tuple[FakeProvider, FakeProvider], clock: FakeClock) -> None:
    fast, slow = providers
    fast.push(Reply.ok(tokens=6, usage=False, delta="tool_calls"),
              Reply.ok(tokens=9, usage=False, delta="reasoning_content"))
    with served(priced_doc(fast, slow), [make_client("alice")], clock) as gw:
        assert gw.chat("alice", stream=True).status_code == 200
        assert gw.chat("alice", stream=True).status_code == 200
        rows = gw.usage()
    assert [(r["requests"], r["prompt_tokens"], r["completion_tokens"]) for r in rows] == \
        [(2, 5 + 5, 6 + 9)]  # "hi": 5 prompt tokens estimated each


def test_fifty_requests_at_once_against_a_budget_worth_one_and_a_half(
        providers: tuple[FakeProvider, FakeProvider], clock: FakeClock) -> None:
    """Each request holds its worst case (prompt estimate + max_tokens, priced) while in
    flight: at most 2 of 50 concurrent requests are served (before issue 32: all 50)."""
    fast, slow = providers
    prompt = 8000 // 4 + 4  # the estimate of 8,000 characters in one message
    fast.default = Reply.ok(tokens=1000, prompt_tokens=prompt, ttfb_s=0.3)
    one = (prompt * PRICE_IN + 1000 * PRICE_OUT) / 1e6
    body = {"messages": [{"role": "user", "content": "x" * 8000}], "max_tokens": 1000}
    with served(roomy_doc(fast, slow), [make_client("alice", monthly_usd=1.5 * one)],
                clock) as gw:
        with ThreadPoolExecutor(50) as pool:
            answers = list(pool.map(lambda _: gw.chat("alice", **body), range(50)))
        rows = gw.usage()
    codes = [a.status_code for a in answers]
    served_n = codes.count(200)
    assert 1 <= served_n <= 2 and codes.count(429) == 50 - served_n, codes
    assert {a.json()["error"]["code"] for a in answers if a.status_code == 429} == \
        {"budget_exceeded"}
    assert len(fast.seen) + len(slow.seen) == served_n
    assert sum(r["cost_usd"] for r in rows) <= 2 * one + 1e-12


def test_without_max_tokens_the_models_max_output_is_held(
        providers: tuple[FakeProvider, FakeProvider], clock: FakeClock) -> None:
    """A request without max_tokens holds the model's `max_output` (its default cap) in
    flight: 50 at once against a budget worth 1.5 answers of that size serve at most 2
    (holding the default 256 instead would let ~20 in)."""
    fast, slow = providers
    prompt, cap = 400 // 4 + 4, 4000
    fast.default = Reply.ok(tokens=cap, prompt_tokens=prompt, ttfb_s=0.3)
    one = (prompt * PRICE_IN + cap * PRICE_OUT) / 1e6
    doc = roomy_doc(fast, slow)
    doc["providers"][0]["models"][0]["max_output"] = cap
    body = {"messages": [{"role": "user", "content": "x" * 400}]}
    with (served(doc, [make_client("alice", monthly_usd=1.5 * one)], clock) as gw,
          ThreadPoolExecutor(50) as pool):
        codes = [a.status_code for a in pool.map(lambda _: gw.chat("alice", **body), range(50))]
    assert 1 <= codes.count(200) <= 2 and codes.count(429) == 50 - codes.count(200), codes
    assert len(fast.seen) == codes.count(200)


def test_a_client_that_hangs_up_before_the_first_byte_is_charged_its_prompt(
        providers: tuple[FakeProvider, FakeProvider], clock: FakeClock) -> None:
    fast, slow = providers
    fast.default = Reply.ok(ttfb_s=10.0)  # thinks; notices the gateway leaving
    content = "x" * 100_000
    prompt = len(content) // 4 + 4
    body = json.dumps({"model": "fastco/big-model", "stream": True,
                       "messages": [{"role": "user", "content": content}]}).encode()
    with served(roomy_doc(fast, slow), [make_client("alice")], clock) as gw:
        port = int(gw.url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n"
                         b"content-type: application/json\r\nx-test-client: alice\r\n"
                         b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            wait_for(lambda: len(fast.seen) == 1)  # the provider has it: now hang up
        wait_for(lambda: bool(gw.usage()))
        rows = gw.usage(group_by="client,route")
        wait_for(lambda: fast.disconnected == 1)  # the gateway cut the upstream request
    assert rows == [{"client": "alice", "route": "fastco/big-model", "requests": 1,
                     "prompt_tokens": prompt, "completion_tokens": 0,
                     "cost_usd": prompt * PRICE_IN / 1e6, "errors": 1, **NO_CACHE}]
