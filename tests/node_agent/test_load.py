"""Reading a real server's live load over HTTP: recorded pages of vLLM, llama.cpp, SGLang
and TGI served by a stand-in, the speed followed from read to read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import aiohttp
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from node_agent.cli import node_settings
from node_agent.engines import read_metrics
from node_agent.load import LoadReader, ServerLoad, server_base
from node_agent.serving import serve_app

FIXTURES = Path(__file__).parent / "fixtures"


def page(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_each_engine_read_once() -> None:
    cases = [("vllm_metrics.txt", ServerLoad("vllm", 3, 2, None, pytest.approx(50.0),
                                             kv_cache_usage=0.0421)),
             ("tgi_metrics.txt", ServerLoad("tgi", 8, 5, None, pytest.approx(40.0))),
             ("llamacpp_metrics.txt", ServerLoad("llamacpp", 2, 1, None, pytest.approx(50.0)))]
    for name, load in cases:
        reader = LoadReader("http://127.0.0.1:1", "auto", 12.0)
        assert reader.take(read_metrics(page(name))) == load


def test_vllm_speed_between_two_reads() -> None:
    reader = LoadReader("http://127.0.0.1:1", "vllm", 12.0)
    reader.take(read_metrics(page("vllm_metrics.txt")))  # 51,000 tokens in 1,020 s
    # since the first read: 1,000 tokens in 25 s -> 40 tok/s (the batch grew to 4)
    later = reader.take(read_metrics(page("vllm_metrics_later.txt")))
    assert later == ServerLoad("vllm", 4, 0, None, pytest.approx(40.0), kv_cache_usage=0.0421)
    again = reader.take(read_metrics(page("vllm_metrics_later.txt")))  # nothing generated
    assert again is not None and again.tokens_per_s == pytest.approx(40.0)


def test_server_base_drops_the_openai_suffix() -> None:
    assert server_base("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert server_base("http://h:1") == "http://h:1"


def test_load_from_is_a_node_setting() -> None:
    base = {"model": "m", "shard": "0-31", "layers": 32, "url": "http://127.0.0.1:1"}
    assert node_settings(base, {}).load_from == "auto"
    assert node_settings(base, {"MESHROUTE_NODE_LOAD_FROM": "tgi"}).load_from == "tgi"
    assert node_settings({**base, "load_from": "none"},
                         {"MESHROUTE_NODE_LOAD_FROM": "tgi"}).load_from == "none"
    with pytest.raises(ValueError, match="--load-from"):
        node_settings(base, {"MESHROUTE_NODE_LOAD_FROM": "ollama"})


def _server(pages: dict[str, str]) -> Starlette:
    async def serve(request: Request) -> Response:
        text = pages.get(request.url.path)
        if text is None:
            return PlainTextResponse("not found", status_code=404)
        return PlainTextResponse(text)
    return Starlette(routes=[Route(p, serve) for p in ("/metrics", "/slots", "/props")])


@pytest.mark.anyio
@pytest.mark.parametrize(("pages", "source", "queue", "tps"), [
    ({"/metrics": "vllm_metrics.txt"}, "vllm", 2, 50.0),
    ({"/metrics": "tgi_metrics.txt"}, "tgi", 5, 40.0),
    ({"/metrics": "llamacpp_metrics.txt", "/slots": "llamacpp_slots.json"}, "llamacpp", 1,
     50.0),
    ({"/slots": "llamacpp_slots.json"}, "llamacpp", 0, 12.0),  # no --metrics: the prior
    ({"/metrics": "sglang_metrics.txt"}, "sglang", 2826, 8.536),
    ({"/metrics": "llamacpp_real/metrics_after_max1.txt",
      "/slots": "llamacpp_real/slots_after_max1.json", "/props": "llamacpp_real/props.json"},
     "llamacpp", 0, 12.0),  # one `max_tokens: 1` answer: no speed yet
    ({}, "auto", 0, 12.0),  # nothing exported: queue 0 and the configured figure
])
async def test_the_reader_detects_the_server_over_http(pages: dict[str, str], source: str,
                                                       queue: int, tps: float) -> None:
    app = _server({path: page(name) for path, name in pages.items()})
    async with serve_app(app) as url, aiohttp.ClientSession() as session:
        reader = LoadReader(url + "/v1", "auto", 12.0)
        await reader.read_once(session)
    assert reader.source == source
    assert reader.announcement() == (queue, pytest.approx(tps, rel=1e-3))


@pytest.mark.anyio
async def test_the_reader_follows_the_speed_between_reads() -> None:
    pages: dict[str, Any] = {"/metrics": page("vllm_metrics.txt")}
    app = _server(pages)
    async with serve_app(app) as url, aiohttp.ClientSession() as session:
        reader = LoadReader(url, "vllm", 12.0)
        await reader.read_once(session)
        pages["/metrics"] = page("vllm_metrics_later.txt")
        await reader.read_once(session)
        assert reader.announcement() == (0, pytest.approx(40.0))
        await reader.read_once(session)  # nothing generated since: the last speed stays
        assert reader.announcement() == (0, pytest.approx(40.0))


def test_load_from_takes_sglang() -> None:
    base = {"model": "m", "url": "http://127.0.0.1:1"}
    assert node_settings({**base, "load_from": "sglang"}, {}).load_from == "sglang"


def test_an_unknown_source_is_refused() -> None:
    with pytest.raises(ValueError, match="--load-from"):
        LoadReader("http://127.0.0.1:1", "ollama", 1.0)


@pytest.mark.anyio
@pytest.mark.parametrize(("pages", "asked"), [
    # --metrics and /props say the running requests, the slot count and the context
    ({"/metrics": "metrics_busy.txt", "/slots": "slots_busy.json", "/props": "props.json"},
     ["/metrics", "/props", "/metrics", "/metrics"]),
    # no /props: each slot's n_ctx and the slot count come from /slots
    ({"/metrics": "metrics_busy.txt", "/slots": "slots_busy.json"},
     ["/metrics", "/props", "/slots"] * 3),
    # no --metrics: the busy slots come from /slots
    ({"/slots": "slots_busy.json", "/props": "props.json"},
     ["/metrics", "/props", "/slots", "/metrics", "/slots", "/metrics", "/slots"]),
])
async def test_llamacpps_slots_are_read_only_where_nothing_else_says_it(
        pages: dict[str, str], asked: list[str]) -> None:
    """Each page read is a task on llama.cpp's one loop, between its batches: /slots (two
    tasks' worth with /metrics, every 0.25 s) is left out where /metrics and /props say all
    it says, and the reading is the same."""
    got: list[str] = []
    texts = {path: page("llamacpp_real/" + name) for path, name in pages.items()}

    async def serve(request: Request) -> Response:
        got.append(request.url.path)
        text = texts.get(request.url.path)
        return PlainTextResponse("not found", status_code=404) if text is None \
            else PlainTextResponse(text)
    app = Starlette(routes=[Route(p, serve) for p in ("/metrics", "/slots", "/props")])
    async with serve_app(app) as url, aiohttp.ClientSession() as session:
        reader = LoadReader(url + "/v1", "llamacpp", 12.0)
        for _ in range(3):
            await reader.read_once(session)
    assert got == asked
    assert reader.held() == 2 and reader.slot_count() == 2
