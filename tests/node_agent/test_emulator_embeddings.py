"""The emulated node's /v1/embeddings and /v1/completions, driven by the official client."""

from __future__ import annotations

import json
import math
from typing import Any

import aiohttp
import openai
import pytest

from node_agent.chat import words
from node_agent.cli import node_settings
from node_agent.embeddings import vector
from node_agent.emulator import EmulatorConfig

from .test_emulator import MODEL, _cfg, _mesh, _plan

pytestmark = pytest.mark.anyio


async def test_embeddings_are_deterministic_unit_vectors_per_input() -> None:
    async with _mesh(_cfg("solo", 0, 31, embedding_dim=12)) as [(_, url)]:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        many = await client.embeddings.create(model=MODEL, input=["one two", "three"])
        floats = await client.embeddings.create(model=MODEL, input="three",
                                                encoding_format="float")
        short = await client.embeddings.create(model=MODEL, input=[[1, 2, 3]], dimensions=4)
        await client.close()
    # the client asks for base64 by default and decodes it: the same floats (float32)
    assert [d.index for d in many.data] == [0, 1]
    assert many.data[1].embedding == pytest.approx(floats.data[0].embedding, abs=1e-6)
    assert many.data[0].embedding != many.data[1].embedding
    assert floats.data[0].embedding == vector("three", 12)
    assert len(short.data[0].embedding) == 4
    assert math.fsum(v * v for v in vector([1, 2, 3], 4)) == pytest.approx(1.0)
    assert many.usage.prompt_tokens == 3 and short.usage.prompt_tokens == 3


async def test_embeddings_cross_the_plan_and_fail_like_chat() -> None:
    head, tail = _cfg("head", 0, 15, tps=2000.0), _cfg("tail", 16, 31, tps=2000.0)
    async with _mesh(head, tail) as [(a, ua), (b, ub)], aiohttp.ClientSession() as s:
        plan = _plan((a, ua, 0, 15), (b, ub, 16, 31))
        status, raw = await _post_to(s, ua, "/v1/embeddings",
                                     {"model": MODEL, "input": ["a", "b", "c"]}, plan)
        assert status == 200 and len(json.loads(raw)["data"]) == 3
        assert b.worker.tokens_total == 3  # one pass of every input over the tail's layers
    async with _mesh(_cfg("bad", 0, 31, fail_share=1.0)) as [(_, url)], \
            aiohttp.ClientSession() as s:
        status, raw = await _post_to(s, url, "/v1/embeddings", {"model": MODEL, "input": "x"})
        assert status == 500 and "fault" in json.loads(raw)["error"]["message"]


BAD_EMBEDDINGS: list[tuple[dict[str, Any], str]] = [
    ({"model": MODEL}, "input"),
    ({"model": MODEL, "input": []}, "input"),
    ({"model": MODEL, "input": [1, "a"]}, "input"),
    ({"model": MODEL, "input": "x", "dimensions": 65}, "dimensions"),
    ({"model": MODEL, "input": "x", "encoding_format": "int8"}, "encoding_format"),
]


@pytest.mark.parametrize(("body", "needle"), BAD_EMBEDDINGS)
async def test_bad_embeddings_bodies_are_400s(body: dict[str, Any], needle: str) -> None:
    async with _mesh(_cfg("solo", 0, 31)) as [(_, url)], aiohttp.ClientSession() as s:
        status, raw = await _post_to(s, url, "/v1/embeddings", body)
    assert status == 400 and needle in json.loads(raw)["error"]["message"]


async def test_completions_stream_and_not_like_chat() -> None:
    async with _mesh(_cfg("solo", 0, 31, seconds_per_layer=0.0)) as [(_, url)]:
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        whole = await client.completions.create(model=MODEL, prompt="say hi", max_tokens=5)
        stream = await client.completions.create(
            model=MODEL, prompt="say hi", max_tokens=6, stream=True,
            stream_options={"include_usage": True})
        parts, usage = [], None
        async for chunk in stream:
            if chunk.choices:
                parts.append(chunk.choices[0].text)
            if chunk.usage is not None:
                usage = chunk.usage
        await client.close()
    assert whole.object == "text_completion"
    assert whole.choices[0].text == "".join(words(5))
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 5
    assert "".join(parts) == "".join(words(6)) and usage is not None
    assert usage.completion_tokens == 6 and usage.prompt_tokens == 2


async def test_bad_completions_body_is_a_400() -> None:
    async with _mesh(_cfg("solo", 0, 31)) as [(_, url)], aiohttp.ClientSession() as s:
        status, raw = await _post_to(s, url, "/v1/completions", {"model": MODEL, "prompt": 3})
    assert status == 400 and "prompt" in json.loads(raw)["error"]["message"]


def test_embedding_dim_is_a_node_flag() -> None:
    settings = node_settings({"emulate": True, "embedding_dim": 8}, {})
    assert settings.knobs["embedding_dim"] == 8
    with pytest.raises(ValueError, match="embedding_dim"):
        EmulatorConfig(embedding_dim=0)


async def _post_to(s: aiohttp.ClientSession, url: str, path: str, body: dict[str, Any],
                   headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    async with s.post(url + path, json=body, headers=headers or {}) as resp:
        return resp.status, await resp.read()

