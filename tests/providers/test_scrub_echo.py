"""Issue 22, item 5: a provider echoing its key, in every way a client could read it, through a
real gateway on loopback. The key is the issue's `sk-live/Ab12+Cd34/Ef56==XYZ`."""

from __future__ import annotations

import json
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from meshroute_middleware.app.config import GatewayConfig
from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig
from meshroute_middleware.core.providers.config import parse_providers_config

from ..upstream import ServerThread
from .fake_provider import FakeProvider, Reply
from .gateway import HI, providers_doc

KEYS = {"FAST_A": "sk-live/Ab12+Cd34/Ef56==XYZ", "FAST_B": "sk-live/Zz99+Yy88/Xx77==QRS",
        "SLOW_A": "sk-live/Qq11+Rr22/Ss33==TUV"}


@contextmanager
def gateway(fast: FakeProvider, slow: FakeProvider) -> Iterator[str]:
    base = ServeSettings(mdns=False, seed=3, router=RouterConfig(explore_share=0.0),
                         first_byte_timeout_s=2.0, connect_timeout_s=1.0, state_file=":memory:",
                         providers=parse_providers_config(providers_doc(fast, slow)))
    gw = build_gateway(GatewayConfig.build(base, KEYS))
    with ServerThread(gw.app) as server:
        yield server.url


@pytest.fixture
def served() -> Iterator[tuple[FakeProvider, str]]:
    fast, slow = FakeProvider("fast"), FakeProvider("slow", models=("small-model",))
    with fast.serve(), slow.serve(), gateway(fast, slow) as url:
        yield fast, url


def leaks(text: str) -> list[str]:
    """Every piece of a key (its 4-character groups) a client could read in `text`."""
    text = urllib.parse.unquote(urllib.parse.unquote(text)).replace("\\/", "/")
    return [part for key in KEYS.values() for part in key[8:].replace("+", "/").split("/")
            if part in text]


def seen(resp: httpx.Response) -> str:
    return json.dumps(dict(resp.headers)) + resp.text


def chat(url: str, **body: Any) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", timeout=30,
                      json={"model": "fastco/big-model", "messages": HI, **body})


@pytest.mark.parametrize("form", ["raw", "json", "url"])
@pytest.mark.parametrize("compressed", [False, True], ids=["plain", "gzip"])
def test_a_400_echoing_the_key_in_body_and_header(
        served: tuple[FakeProvider, str], form: str, compressed: bool) -> None:
    fast, url = served
    fast.default = Reply(400, echo_key=True, echo_header=True, echo_form=form,
                         encoding="gzip" if compressed else "")
    resp = chat(url)
    assert resp.status_code == 400
    assert "content-encoding" not in resp.headers  # decoded, not relayed still compressed
    error = resp.json()["error"]  # readable JSON (was gzip bytes without their encoding)
    assert "(key ***)" in error["message"]
    assert resp.headers["x-request-id"] == "req-***"
    assert leaks(seen(resp)) == []
    assert fast.seen and fast.seen[0].key in KEYS.values()  # the key did go upstream


@pytest.mark.parametrize("form", ["raw", "json", "url"])
def test_a_200_echoing_the_key_in_content_and_header(
        served: tuple[FakeProvider, str], form: str) -> None:
    fast, url = served
    fast.default = Reply.ok(echo_content=True, echo_header=True, echo_form=form)
    resp = chat(url)
    assert resp.status_code == 200
    assert resp.json()["choices"][0]["message"]["content"].endswith("your key: ***")
    assert resp.headers["x-request-id"] == "req-***"
    assert leaks(seen(resp)) == []


@pytest.mark.parametrize("form", ["raw", "json", "url"])
def test_a_stream_echoing_the_key_split_across_chunks(
        served: tuple[FakeProvider, str], form: str) -> None:
    fast, url = served
    fast.default = Reply.ok(tokens=3, echo_content=True, echo_header=True, echo_form=form)
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=30, json={
            "model": "fastco/big-model", "messages": HI, "stream": True}) as resp:
        chunks = list(resp.iter_raw())
        headers = dict(resp.headers)
    text = b"".join(chunks).decode()
    assert resp.status_code == 200 and text.endswith("data: [DONE]\n\n")
    assert headers["x-request-id"] == "req-***"
    assert "your key: ***" in text and leaks(text + json.dumps(headers)) == []
    events = [json.loads(line[6:]) for line in text.split("\n\n") if line.startswith("data: {")]
    assert [e["choices"][0]["delta"].get("content") for e in events[:4]] == [
        "your key: ***", "t0 ", "t1 ", "t2 "]


@pytest.mark.parametrize("encoding", ["br", "zstd"])
def test_an_error_in_a_coding_we_cannot_read_is_replaced_by_ours(
        served: tuple[FakeProvider, str], encoding: str) -> None:
    fast, url = served
    fast.default = Reply(400, echo_key=True, encoding=encoding)
    resp = chat(url)
    assert resp.status_code == 400 and "content-encoding" not in resp.headers
    assert resp.json()["error"]["code"] == "upstream_undecodable"
    assert leaks(seen(resp)) == []
