"""`meshroute.affinity` on a request's span and on its attempts' (issue 35): whether provider-key
affinity kept the conversation's warm key, or broke it and why, into the real OTLP/HTTP
receiver of test_tracing.py. A conversation's first turn is `new`, its next `kept`; a 429 on
the warm key makes that attempt `kept` and the next one (another key) `cooling`; after the
provider's `cache_ttl` (a fake clock) it is `expired`."""

from __future__ import annotations

from typing import Any

import httpx

from ..conftest import FakeClock
from ..providers.fake_provider import FakeProvider, Reply
from ..providers.gateway import ENV, gateway, providers_doc
from .test_tracing import Receiver, _attempts, _no_secret_in, receiver

__all__ = ["receiver"]  # the fixture, used by name

T0 = 1_700_000_000.0


def _turn(url: str, messages: list[dict[str, Any]], text: str) -> None:
    messages.append({"role": "user", "content": text})
    answer = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                        json={"model": "fastco/big-model", "messages": messages})
    assert answer.status_code == 200, answer.text
    messages.append(answer.json()["choices"][0]["message"])


def _requests(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The request spans, in the order the requests were made (their start)."""
    return [s for s in spans if s["attrs"].get("url.path") == "/v1/chat/completions"]


def test_the_spans_say_whether_affinity_kept_the_key_and_why_not(
        receiver: Receiver) -> None:
    fast, slow = FakeProvider("fast"), FakeProvider("slow", models=("small-model",))
    clock = FakeClock(T0)
    with fast.serve(), slow.serve():
        doc = providers_doc(fast, slow)
        doc["providers"][0]["cache_ttl"] = "5m"
        with gateway(doc, clock=clock, otlp_endpoint=receiver.url) as gw:
            messages: list[dict[str, Any]] = [{"role": "system", "content": "be brief"}]
            _turn(gw.url, messages, "one")  # new
            _turn(gw.url, messages, "two")  # kept
            warm = fast.seen[-1].key
            fast.push(Reply.rate_limited("30"))  # the warm key answers 429: the other takes it
            _turn(gw.url, messages, "three")
            clock.advance(301)
            _turn(gw.url, messages, "four")  # expired
            spans = receiver.wait(4 + 5)
    requests = _requests(spans)
    assert len(requests) == 4
    verdicts = [r["attrs"].get("meshroute.affinity") for r in requests]
    assert verdicts == ["new", "kept", "cooling", "expired"], verdicts
    attempts = [[a["attrs"] for a in _attempts(spans, r)] for r in requests]
    assert [a["meshroute.affinity"] for a in attempts[1]] == ["kept"]
    third = attempts[2]
    assert [a["meshroute.affinity"] for a in third] == ["kept", "cooling"]
    assert third[0]["error.type"] == "http_429"
    assert third[0]["meshroute.key_position"] != third[1]["meshroute.key_position"]
    assert fast.seen[2].key == warm and fast.seen[3].key != warm
    _no_secret_in(spans, *ENV.values())


def test_a_request_that_is_no_conversation_has_no_affinity_attribute(
        receiver: Receiver) -> None:
    fast, slow = FakeProvider("fast"), FakeProvider("slow", models=("small-model",))
    with fast.serve(), slow.serve():
        doc = providers_doc(fast, slow)
        doc["providers"][0]["cache_ttl"] = "5m"
        doc["providers"][0]["models"][0]["capabilities"] = ["embeddings"]
        with gateway(doc, otlp_endpoint=receiver.url) as gw:
            answer = httpx.post(f"{gw.url}/v1/embeddings", timeout=30,
                                json={"model": "fastco/big-model", "input": "hi"})
            assert answer.status_code == 200, answer.text
            spans = receiver.wait(2)
    assert not any("meshroute.affinity" in s["attrs"] for s in spans), spans
