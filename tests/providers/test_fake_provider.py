"""The fake provider answers as scripted and logs the key and model of every request."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from .fake_provider import FakeProvider, Reply

KEY_A, KEY_B = "sk-fake-a", "sk-fake-b"


def post(fp: FakeProvider, key: str | None, stream: bool = False,
         model: str = "big-model") -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.post(f"{fp.base_url}/chat/completions", headers=headers, timeout=10,
                      json={"model": model, "stream": stream,
                            "messages": [{"role": "user", "content": "hi"}]})


def events(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def test_a_scripted_sequence_then_the_default() -> None:
    fp = FakeProvider(script=[Reply.rate_limited("7"), Reply.error(503)],
                      default=Reply.ok(tokens=3))
    with fp.serve():
        first, second, third = (post(fp, k) for k in (KEY_A, KEY_B, KEY_A))
    assert (first.status_code, first.headers["retry-after"]) == (429, "7")
    assert first.json()["error"]["type"] == "rate_limit_error"
    assert second.status_code == 503
    assert third.status_code == 200
    assert third.json()["usage"] == {"prompt_tokens": 5, "completion_tokens": 3,
                                     "total_tokens": 8}
    assert fp.keys == [KEY_A, KEY_B, KEY_A]
    assert [s.model for s in fp.seen] == ["big-model"] * 3


def test_per_key_answers() -> None:
    fp = FakeProvider(by_key={KEY_A: Reply.rate_limited(None)})
    with fp.serve():
        assert post(fp, KEY_A).status_code == 429
        assert "retry-after" not in post(fp, KEY_A).headers
        assert post(fp, KEY_B).status_code == 200
        assert post(fp, None).status_code == 200
    assert fp.keys == [KEY_A, KEY_A, KEY_B, None]


def test_a_stream_ends_with_usage_and_done() -> None:
    fp = FakeProvider(default=Reply.ok(tokens=4))
    with fp.serve():
        resp = post(fp, KEY_A, stream=True)
    assert resp.headers["content-type"].startswith("text/event-stream")
    data = events(resp.text)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == (
        "t0 t1 t2 t3 ")
    assert chunks[-1]["usage"]["completion_tokens"] == 4
    assert fp.seen[0].stream


def test_a_broken_stream_stops_without_done() -> None:
    fp = FakeProvider(default=Reply.broken(after=2))
    got: list[bytes] = []
    with fp.serve(), pytest.raises(httpx.RemoteProtocolError), httpx.stream(
            "POST", f"{fp.base_url}/chat/completions", timeout=10,
            json={"model": "big-model", "stream": True, "messages": []}) as resp:
        for part in resp.iter_raw():
            got.append(part)
    text = b"".join(got).decode()
    assert len(events(text)) == 2 and "[DONE]" not in text


def test_a_slow_first_byte() -> None:
    fp = FakeProvider(default=Reply.slow(0.3))
    with fp.serve():
        start = time.monotonic()
        assert post(fp, KEY_A).status_code == 200
        assert time.monotonic() - start >= 0.3  # a lower bound only: holds on a busy machine


def test_an_unknown_model_is_404_and_still_logged() -> None:
    fp = FakeProvider()
    with fp.serve():
        assert post(fp, KEY_A, model="nope").status_code == 404
    assert fp.seen[0].model == "nope"


def test_the_official_client_talks_to_it() -> None:
    fp = FakeProvider(default=Reply.ok(tokens=2))
    with fp.serve():
        client = openai.OpenAI(base_url=fp.base_url, api_key=KEY_B, max_retries=0)
        out = client.chat.completions.create(model="big-model",
                                             messages=[{"role": "user", "content": "hi"}])
        assert out.choices[0].message.content == "t0 t1"
        assert [m.id for m in client.models.list()] == ["big-model"]
    assert fp.keys == [KEY_B]
