"""A client's rpm before expensive work (issue 32, row 8): `/v1/messages/count_tokens` counts
against it (it was under no rpm), and a client already over it is refused before a large
body is judged or read."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from meshroute_middleware.chat import intake
from meshroute_middleware.http.shape import INLINE_BYTES

from ..conftest import FakeClock
from .fake_provider import FakeProvider
from .test_client_spend import H_TEST_CLIENT, T0, make_client, priced_doc, served

NO_CACHE = {"cached_tokens": 0, "cache_write_tokens": 0}  # nothing cached (issue 35)

COUNT = {"model": "fastco/big-model", "messages": [{"role": "user", "content": "hi"}]}


def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{url}{path}", json=body, timeout=30,
                      headers={H_TEST_CLIENT.decode(): "alice"})


def test_count_tokens_is_under_the_clients_rpm(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    with served(priced_doc(fast, slow), [make_client("alice", rpm=2)], FakeClock(T0)) as gw:
        answers = [post(gw.url, "/v1/messages/count_tokens", COUNT) for _ in range(3)]
        chat = gw.chat("alice")  # the minute's two requests are spent
        rows = gw.usage(group_by="client,route")
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert answers[0].json()["input_tokens"] > 0
    refused = answers[2].json()  # Anthropic's shape
    assert refused["type"] == "error" and refused["error"]["type"] == "rate_limit_error"
    assert "rpm" in refused["error"]["message"]
    assert answers[2].headers["retry-after"]
    assert chat.status_code == 429
    assert fast.seen == []  # counting tokens reaches no provider
    assert rows == [{"client": "alice", "route": "none", "requests": 2, "prompt_tokens": 0,
                     "completion_tokens": 0, "cost_usd": 0.0, "errors": 0, **NO_CACHE}]


def test_a_client_over_its_rpm_is_refused_before_a_large_body_is_read(
        providers: tuple[FakeProvider, FakeProvider], monkeypatch: pytest.MonkeyPatch) -> None:
    fast, slow = providers
    judged: list[int] = []
    check_large = intake.check_large

    def recorded(body: bytes, limits: Any) -> None:
        judged.append(len(body))
        check_large(body, limits)

    monkeypatch.setattr(intake, "check_large", recorded)
    large = {**COUNT, "messages": [{"role": "user", "content": "x" * 100}] * 1_000}
    clients = [make_client("alice", rpm=1), make_client("bob")]
    with served(priced_doc(fast, slow), clients, FakeClock(T0)) as gw:
        first = post(gw.url, "/v1/chat/completions", COUNT)  # small: the minute's one
        second = post(gw.url, "/v1/chat/completions", large)
        assert judged == []
        httpx.post(f"{gw.url}/v1/chat/completions", json=large, timeout=30,
                   headers={H_TEST_CLIENT.decode(): "bob"})  # under no rpm: judged
    assert first.status_code == 200, first.text
    assert second.status_code == 429
    assert second.json()["error"]["code"] == "client_rate_limited"
    assert len(judged) == 1 and judged[0] > INLINE_BYTES  # bob's
    assert len(fast.seen) == 1
