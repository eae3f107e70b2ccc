"""Issue 11, item 5 — measurements are clamped: a node's claims about its own usage never
raise, and never reach the statistics past the request's max_tokens (or a ceiling when it
has none) or past MAX_TPS."""

from __future__ import annotations

import logging
import math
import socket

import httpx
import pytest

from meshroute_middleware.chat.attempts import Measurement
from meshroute_middleware.core.contracts.limits import MAX_TPS
from meshroute_middleware.forwarding.measure import TokenMeter

from ..chat.test_forward import chat
from .edge_util import EdgeGateway, RawNode, completion

CEILING = 1 << 20  # chat.attempts.DEFAULT_TOKEN_CEILING


def _answer(tokens: str, streaming: bool = False) -> RawNode:
    def script(sock: socket.socket, head: bytes) -> None:
        if streaming:
            body = (b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
                    b'data: {"choices":[],"usage":{"completion_tokens":' + tokens.encode()
                    + b'}}\n\ndata: [DONE]\n\n')
            ctype = b"text/event-stream"
        else:
            body, ctype = completion(tokens), b"application/json"
        sock.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: " + ctype + b"\r\ncontent-length: "
                     + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + body)
    return RawNode(script)


@pytest.mark.parametrize("stream", [False, True])
def test_a_5000_digit_token_count_neither_raises_nor_counts(
        stream: bool, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    with _answer("9" * 5000, streaming=stream) as liar, EdgeGateway() as gw:
        assert gw.register("liar", liar.url).status_code in (200, 201)
        # a stream's client asks for usage: the node's usage chunk is then its to see
        asked = {"stream_options": {"include_usage": True}} if stream else {}
        resp = httpx.post(gw.url + "/v1/chat/completions", timeout=10,
                          json=chat(max_tokens=64, stream=stream, **asked))
        assert resp.status_code == 200
        assert resp.text.count("9" * 5000) == 1  # relayed untouched, complete
        [outcome] = gw.outcomes()
        assert outcome["ok"] is True
        assert outcome["completion_tokens"] <= 64
        assert outcome["tps"] is None or outcome["tps"] <= MAX_TPS
    # no traceback in the gateway's log (it raised ValueError in the settle path)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


@pytest.mark.parametrize("tokens", ["1" + "0" * 300, "1e300", "123456789012345678901"])
def test_absurd_counts_do_not_poison_the_statistics(tokens: str) -> None:
    with _answer(tokens) as liar, EdgeGateway() as gw:
        assert gw.register("liar", liar.url).status_code in (200, 201)
        for _ in range(3):
            resp = httpx.post(gw.url + "/v1/chat/completions", json=chat(), timeout=10)
            assert resp.status_code == 200
        for outcome in gw.outcomes():
            assert outcome["completion_tokens"] <= CEILING
            assert outcome["tps"] is None or outcome["tps"] <= MAX_TPS
        table = httpx.get(gw.url + "/v1/routing").json()["models"]["m"]["candidates"]
        for row in table:
            assert row["tps"] is None or (math.isfinite(row["tps"]) and row["tps"] <= MAX_TPS)
        learned = gw.gateway.router.policy.estimate("m|liar[0-39]")  # type: ignore[attr-defined]
        assert learned is None or learned <= MAX_TPS  # no 1e300-sized figure learned


def test_measurement_clamps_to_max_tokens_and_max_tps() -> None:
    from meshroute_middleware.chat.attempts import DEFAULT_TOKEN_CEILING
    assert DEFAULT_TOKEN_CEILING == CEILING
    m = Measurement(max_tokens=50)
    meter = m.answer([(b"content-type", b"application/json")])
    meter.feed(completion("9" * 5000))
    m.first = m.last = m.start + 2.0
    assert m.outcome().completion_tokens == 50
    fast = Measurement()  # no max_tokens: the ceiling
    fast.answer([]).feed(completion(10 ** 12))
    fast.last = fast.start + 1e-3  # a millisecond: 1e15 tokens/s claimed
    out = fast.outcome()
    assert out.completion_tokens <= min(CEILING, MAX_TPS * 1e-3)
    assert out.tps is not None and out.tps <= MAX_TPS


def test_token_meter_reads_huge_counts_without_int_overflow() -> None:
    meter = TokenMeter(streaming=True)
    meter.feed(b'data: {"usage":{"completion_tokens":' + b"7" * 5000 + b"}}\n\n")
    assert meter.completion_tokens == 10 ** 18  # a sentinel, clamped by the Measurement
