"""Exhaustion statuses by cause (issue 24), through `meshroute serve` as a real process and
the official openai client: upstream failures are 502 `upstream_failed`, refused keys are
never a 429, and a 429 stays a 429 (with `Retry-After`) when any route was rate limited."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest

from ..upstream import serve_process
from .fake_provider import FakeProvider, Reply
from .gateway import ENV, HI, assert_no_key_in


def config_text(fast: FakeProvider, slow: FakeProvider) -> str:
    """A two-provider chain: fastco (two keys) then slowco (one key)."""
    return f"""
[routing]
chain = ["fastco/big-model", "slowco/small-model"]

[[providers]]
name = "fastco"
base_url = "{fast.base_url}"
keys = ["env:FAST_A", "env:FAST_B"]
cache_ttl = 0  # keys by turns (round-robin): every request sends one prompt

[[providers.models]]
id = "big-model"
tier = "large"

[[providers]]
name = "slowco"
base_url = "{slow.base_url}"
keys = ["env:SLOW_A"]

[[providers.models]]
id = "small-model"
tier = "small"
"""


@contextmanager
def served(fast: FakeProvider, slow: FakeProvider, tmp_path: Path) -> Iterator[openai.OpenAI]:
    config = tmp_path / "meshroute.toml"
    config.write_text(config_text(fast, slow))
    flags = ["--config", str(config), "--state-file", str(tmp_path / "state.db")]
    with serve_process(flags, tmp_path / "log", ENV) as (url, _):
        yield openai.OpenAI(base_url=f"{url}/v1", api_key="client-own-key", max_retries=0)
    assert_no_key_in((tmp_path / "log").read_text())


def ask(client: openai.OpenAI, model: str = "auto") -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model=model, messages=HI)  # type: ignore[arg-type]
    return info.value


def routes(error: openai.APIStatusError) -> dict[str, str]:
    body: Any = error.body
    return {r["route"]: r["reason"] for r in body["routes"]}


def test_a_chain_answering_only_500_is_502_upstream_failed(
        providers: tuple[FakeProvider, FakeProvider], tmp_path: Path) -> None:
    fast, slow = providers
    fast.default = slow.default = Reply.error(500)
    with served(fast, slow, tmp_path) as client:
        error = ask(client)
    # the openai SDK raises InternalServerError for a 5xx, never RateLimitError (was 429)
    assert isinstance(error, openai.InternalServerError)
    assert not isinstance(error, openai.RateLimitError)
    assert error.status_code == 502 and "retry-after" not in error.response.headers
    body: Any = error.body
    assert body["code"] == "upstream_failed" and body["type"] == "server_error"
    assert "failed upstream" in body["message"]
    assert routes(error) == {"fastco/big-model#1": "http_5xx",
                             "slowco/small-model#1": "http_5xx"}
    assert [r["until"] for r in body["routes"]] == [None, None]
    assert len(fast.seen) == 1 and len(slow.seen) == 1  # a 5xx moves on to the next route


def test_every_key_refused_is_502_now_and_on_every_later_request(
        providers: tuple[FakeProvider, FakeProvider], tmp_path: Path) -> None:
    fast, slow = providers
    fast.default = slow.default = Reply.error(401)
    with served(fast, slow, tmp_path) as client:
        first = ask(client)
        later = [ask(client) for _ in range(3)]
    assert [e.status_code for e in (first, *later)] == [502] * 4  # was 429, then 429
    assert not any(isinstance(e, openai.RateLimitError) for e in (first, *later))
    assert routes(first) == {"fastco/big-model#1": "http_401", "fastco/big-model#2": "http_401",
                             "slowco/small-model#1": "http_401"}
    for error in later:  # the keys are out of rotation: nothing is sent, the answer holds
        body: Any = error.body
        assert body["code"] == "upstream_failed" and "refused every key" in body["message"]
        assert set(routes(error).values()) == {"revoked"}
        assert error.response.headers["x-meshroute-attempts"] == "0"
        assert "retry-after" not in error.response.headers
    assert len(fast.seen) == 2 and len(slow.seen) == 1  # each key was asked once


def test_a_429_beside_a_500_is_429_with_retry_after(
        providers: tuple[FakeProvider, FakeProvider], tmp_path: Path) -> None:
    fast, slow = providers
    fast.default = Reply.rate_limited("7")
    slow.default = Reply.error(500)
    with served(fast, slow, tmp_path) as client:
        first = ask(client)
        again = ask(client)
    for error in (first, again):
        assert isinstance(error, openai.RateLimitError) and error.status_code == 429
        assert 1 <= int(error.response.headers["retry-after"]) <= 7  # the keys' cooldown
        body: Any = error.body
        assert body["code"] == "rate_limited" and body["type"] == "rate_limit_error"
    assert routes(first) == {"fastco/big-model#1": "http_429", "fastco/big-model#2": "http_429",
                             "slowco/small-model#1": "http_5xx"}
    assert routes(again) == {"fastco/big-model#1": "cooldown", "fastco/big-model#2": "cooldown",
                             "slowco/small-model#1": "http_5xx"}
