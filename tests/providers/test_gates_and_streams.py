"""Each key gate, the 429 ladder, wait_for_key_s, timeouts and streams, through the gateway."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any

import httpx
import pytest

from ..conftest import FakeClock
from .fake_provider import FakeProvider, Reply
from .gateway import HI, assert_no_key_in, gateway, providers_doc

T0 = 1_796_040_000.0  # 2026-11-30 06:40 UTC: a day and a month well under way


def reasons(answer: httpx.Response) -> dict[str, str]:
    return {r["route"]: r["reason"] for r in answer.json()["error"]["routes"]}


# tpm/tpd: the estimate (~105 tokens) would fit twice in 300; usage (258) settles it.
@pytest.mark.parametrize(("limits", "body", "reason"), [
    ({"rpm": 1}, {}, "rpm"),
    ({"rpd": 1}, {}, "rpd"),
    ({"tpm": 300}, {"max_tokens": 100}, "tpm"),
    ({"tpd": 300}, {"max_tokens": 100}, "tpd"),
])
def test_each_rate_gate_passes_a_key_over_without_sending(
        providers: tuple[FakeProvider, FakeProvider], limits: dict[str, int],
        body: dict[str, Any], reason: str) -> None:
    fast, slow = providers
    fast.default = Reply(prompt_tokens=250)
    clock = FakeClock(T0)
    with gateway(providers_doc(fast, slow, fast_limits=limits), clock=clock) as gw:
        served = [gw.chat("fastco/big-model", **body) for _ in range(2)]
        assert [a.headers["x-meshroute-route"] for a in served] == [
            "fastco/big-model#1", "fastco/big-model#2"]
        over = gw.chat("fastco/big-model", **body)
        fallback = gw.chat("auto", **body)
    assert over.status_code == 429
    assert reasons(over) == {"fastco/big-model#1": reason, "fastco/big-model#2": reason}
    assert int(over.headers["retry-after"]) >= 1
    assert over.headers["x-meshroute-attempts"] == "0"
    assert fallback.status_code == 200
    assert fallback.headers["x-meshroute-tried"] == "slowco/small-model#1"
    assert len(fast.seen) == 2


def test_the_monthly_budget_is_a_gate(providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    doc = providers_doc(fast, slow)
    doc["providers"][0]["models"][0]["monthly_tokens"] = 300
    with gateway(doc, clock=FakeClock(T0)) as gw:
        answer = gw.chat("fastco/big-model", max_tokens=400)
    assert answer.status_code == 429
    assert set(reasons(answer).values()) == {"budget"}


def test_a_429_without_retry_after_climbs_the_ladder(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    doc = providers_doc(fast, slow)
    doc["providers"][0]["keys"] = ["env:FAST_A"]
    fast.default = Reply.rate_limited(None)
    clock = FakeClock(T0)
    with gateway(doc, clock=clock) as gw:
        first = gw.chat("fastco/big-model")
        assert first.status_code == 429 and first.headers["retry-after"] == "30"
        clock.advance(31)
        second = gw.chat("fastco/big-model")
        assert second.headers["retry-after"] == "120"  # the second rung
        view = httpx.get(f"{gw.url}/v1/routing/chain", params={"model": "fastco/big-model"})
        assert view.json()["chain"][0]["keys"][0]["until"] == T0 + 31 + 120
    assert len(fast.seen) == 2


def test_wait_for_key_waits_for_the_soonest_reset_instead_of_failing(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    doc = providers_doc(fast, slow, routing={"wait_for_key_s": 5})
    doc["providers"][0]["keys"] = ["env:FAST_A"]
    fast.push(Reply.rate_limited("1"))  # one 429 with a 1 s cooldown, then answers
    with gateway(doc) as gw:  # the real clock: the gateway really waits about a second
        answer = gw.chat("fastco/big-model")
    assert answer.status_code == 200
    assert answer.headers["x-meshroute-tried"] == "fastco/big-model#1,fastco/big-model#1"
    assert len(fast.seen) == 2


def test_a_slow_first_byte_times_out_and_falls_over(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.default = Reply.slow(5.0)
    with gateway(providers_doc(fast, slow), first_byte_timeout_s=0.3) as gw:
        answer = gw.chat("fastco/big-model")
        both = gw.chat("auto", route=["fastco/big-model"])
    assert answer.status_code == 502  # issue 24: timeouts are upstream failures (was 429)
    assert answer.json()["error"]["code"] == "upstream_failed"
    assert set(reasons(answer).values()) == {"timeout"}
    assert both.status_code == 200
    assert both.headers["x-meshroute-route"] == "slowco/small-model#1"


def stream(url: str, model: str = "auto", **body: Any) -> tuple[httpx.Response, str]:
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=30,
                      json={"model": model, "messages": HI, "stream": True, **body}) as r:
        return r, "".join(r.iter_text())


def test_a_stream_broken_before_its_first_chunk_fails_over_invisibly(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.default = Reply.broken(after=0)
    with gateway(providers_doc(fast, slow)) as gw:
        resp, text = stream(gw.url, route=["fastco/big-model"])
    assert resp.status_code == 200
    assert resp.headers["x-meshroute-route"] == "slowco/small-model#1"
    assert resp.headers["x-meshroute-tried"] == "fastco/big-model#1,slowco/small-model#1"
    assert "t0 " in text and text.rstrip().endswith("data: [DONE]")
    assert "error" not in text
    assert slow.seen[0].model == "small-model" and slow.seen[0].stream


def test_a_stream_broken_after_content_ends_with_an_sse_error(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    # The head drops the connection only once the client has the first chunk: a reset sent
    # with the chunks may discard them in the gateway's receive buffer (TCP RST), which is a
    # failure before the first byte, a different case (the test above).
    seen_content = threading.Event()
    fast.default = dataclasses.replace(Reply.broken(after=2), break_when=seen_content)
    lines: list[str] = []
    with gateway(providers_doc(fast, slow)) as gw, httpx.stream(
            "POST", f"{gw.url}/v1/chat/completions", timeout=30,
            json={"model": "fastco/big-model", "messages": HI, "stream": True}) as resp:
        for line in resp.iter_lines():
            lines.append(line)
            if '"content":"t' in line.replace(" ", ""):
                seen_content.set()
        text = "\n".join(lines)
    assert resp.status_code == 200
    assert resp.headers["x-meshroute-route"] == "fastco/big-model#1"
    events = [json.loads(line[6:]) for line in text.splitlines()
              if line.startswith("data: {")]
    assert events[0]["choices"][0]["delta"]["content"] == "t0 "
    assert "error" in events[-1]
    assert slow.seen == []  # too late to fail over: the client had content


def test_a_stream_settles_its_reservation_from_usage(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    clock = FakeClock(T0)
    with gateway(providers_doc(fast, slow, fast_limits={"tpm": 400}), clock=clock) as gw:
        for _ in range(4):  # each reserves ~265 tokens, and settles at usage's 13
            resp, _ = stream(gw.url, "fastco/big-model")
            assert resp.status_code == 200
    assert len(fast.seen) == 4


def test_session_sticks_to_the_route_that_served_it(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    with gateway(providers_doc(fast, slow), clock=FakeClock(T0)) as gw:
        first = gw.chat("auto", route=["slowco/small-model"],
                        headers={"x-session-id": "s1"})
        assert first.headers["x-meshroute-route"] == "slowco/small-model#1"
        later = [gw.chat("auto", headers={"x-session-id": "s1"}) for _ in range(5)]
        assert {a.headers["x-meshroute-route"] for a in later} == {"slowco/small-model#1"}
        slow.default = Reply.rate_limited("60")  # the session's route becomes unusable
        moved = gw.chat("auto", headers={"x-session-id": "s1"})
        assert moved.headers["x-meshroute-route"].startswith("fastco/big-model#")
        then = gw.chat("auto", headers={"x-session-id": "s1"})
        assert then.headers["x-meshroute-attempts"] == "1"  # sticks to fastco, a key of it
        assert then.headers["x-meshroute-route"].startswith("fastco/big-model#")
    assert len(slow.seen) == 7  # the first, five sticky ones, and the one 429
    assert_no_key_in(*(a.text for a in later))


def test_a_pin_that_is_no_route_is_400(providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    with gateway(providers_doc(fast, slow)) as gw:
        answer = gw.chat("auto", route=["nosuch/model"])
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "invalid_route"


def test_a_client_that_leaves_cancels_the_upstream_and_frees_its_reservation(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    doc = providers_doc(fast, slow, fast_limits={"tpm": 300})
    doc["providers"][0]["keys"] = ["env:FAST_A"]
    fast.push(Reply.slow(20.0))
    with gateway(doc, clock=FakeClock(T0)) as gw:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{gw.url}/v1/chat/completions", timeout=0.5,
                       json={"model": "fastco/big-model", "messages": HI, "max_tokens": 200})
        deadline = time.monotonic() + 30
        while not fast.disconnected:  # the gateway hung up on the provider
            assert time.monotonic() < deadline
            time.sleep(0.02)
        # 205 tokens reserved would leave no room for another 205 under tpm = 300
        answer = gw.chat("fastco/big-model", max_tokens=200)
    assert answer.status_code == 200


def test_a_role_only_first_chunk_is_held_back_so_a_break_still_fails_over(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.default = Reply(200, 8, break_after=0, role_first=True)
    with gateway(providers_doc(fast, slow)) as gw:
        resp, text = stream(gw.url, route=["fastco/big-model"])
    assert resp.headers["x-meshroute-route"] == "slowco/small-model#1"
    assert '"role"' not in text and "error" not in text and "t0 " in text
