"""The emulated node tells whether a prompt's prefix was warm (x-meshroute-cache), and the
gateway passes that header on to the client."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from meshroute_middleware.chat.headers import node_headers
from meshroute_middleware.core.contracts.cache import (
    CACHE_HEADER,
    CacheNote,
    cache_note,
    encode_cache,
    parse_cache,
)
from node_agent.chat import words
from node_agent.emulator import EmulatorConfig, serve_node

SYSTEM = {"role": "system", "content": "x" * 4000}  # ~1,000 tokens


def test_the_note_is_warm_partial_or_cold_and_parses_back() -> None:
    assert cache_note(0, 900).state == "cold"
    assert cache_note(100, 900).state == "partial"
    assert cache_note(450, 900).state == "warm"
    assert cache_note(5000, 900) == CacheNote("warm", 900, 900)  # never above the prompt
    note = cache_note(800, 900)
    assert parse_cache(encode_cache(note)) == note


@pytest.mark.parametrize("value", [
    None, "", "warm", "hot; cached=1; prompt=2", "warm; cached=3; prompt=2",
    "warm; cached=1; prompt=2" + " " * 100, "cold; cached=-1; prompt=2",
    "warm; cached=1; prompt=99999999999",
])
def test_a_foreign_or_broken_value_is_no_note(value: str | None) -> None:
    assert parse_cache(value) is None


async def _turn(session: aiohttp.ClientSession, url: str, messages: list[Any],
                stream: bool) -> tuple[str | None, str]:
    body = {"model": "m", "messages": messages, "max_tokens": 8, "stream": stream}
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        text = await resp.text()
        return resp.headers.get(CACHE_HEADER), text


@pytest.mark.anyio
@pytest.mark.parametrize("stream", [False, True])
async def test_the_returning_turn_is_reported_warm(stream: bool) -> None:
    cfg = EmulatorConfig(node_id="n", model="m", start=0, end=31, layers=32,
                         seconds_per_layer=0.0001, prefill_tps=100_000.0,
                         cache_tokens=100_000)
    answer = "".join(words(8))
    turn1 = [SYSTEM, {"role": "user", "content": "hi"}]
    turn2 = [*turn1, {"role": "assistant", "content": answer},
             {"role": "user", "content": "and then?"}]
    async with serve_node(cfg) as (_, url), aiohttp.ClientSession() as session:
        first, _ = await _turn(session, url, turn1, stream)
        second, _ = await _turn(session, url, turn2, stream)
        other, _ = await _turn(session, url, [{"role": "user", "content": "y" * 400}], stream)
    one, two, three = parse_cache(first), parse_cache(second), parse_cache(other)
    assert one is not None and one.state == "cold" and one.cached_tokens == 0
    assert two is not None and two.state == "warm"
    assert two.cached_tokens > 0.9 * two.prompt_tokens  # all but the new message
    assert three is not None and three.state == "cold"


@pytest.mark.anyio
async def test_a_node_without_a_cache_sends_no_note() -> None:
    cfg = EmulatorConfig(node_id="n", model="m", start=0, end=31, layers=32,
                         seconds_per_layer=0.0001)
    async with serve_node(cfg) as (_, url), aiohttp.ClientSession() as session:
        note, _ = await _turn(session, url, [SYSTEM], False)
    assert note is None


def test_the_gateway_passes_the_note_on_and_no_other_node_header_of_ours() -> None:
    got = node_headers([(b"x-meshroute-cache", b"warm; cached=9; prompt=10"),
                        (b"x-meshroute-route", b"forged"), (b"content-type", b"x")])
    assert got == [(b"x-meshroute-cache", b"warm; cached=9; prompt=10"),
                   (b"content-type", b"x")]
