"""Reading a real server's live load: recorded metric pages of vLLM, llama.cpp and TGI."""

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
from node_agent.load import (
    LoadFormatError,
    LoadReader,
    ServerLoad,
    detect,
    llamacpp_load,
    parse_prometheus,
    parse_slots,
    server_base,
    tgi_load,
    vllm_load,
)
from node_agent.serving import serve_app

FIXTURES = Path(__file__).parent / "fixtures"


def page(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_prometheus_text_is_parsed_and_label_sets_summed() -> None:
    m = parse_prometheus('# HELP x y\nx{a="1"} 2\nx{a="2",b="}"} 3.5\ny 7 1700000000\n'
                         "z NaN\n")
    assert m["x"] == 5.5 and m["y"] == 7.0
    for bad in ("x{a=1 2", "x", "x abc"):
        with pytest.raises(LoadFormatError):
            parse_prometheus(bad)


@pytest.mark.parametrize(("name", "source"), [("vllm_metrics.txt", "vllm"),
                                              ("llamacpp_metrics.txt", "llamacpp"),
                                              ("tgi_metrics.txt", "tgi")])
def test_the_server_is_recognised_from_its_metrics(name: str, source: str) -> None:
    assert detect(parse_prometheus(page(name))) == source
    assert detect({"process_cpu_seconds_total": 1.0}) is None


def test_vllm_running_waiting_and_speed_between_two_reads() -> None:
    first = parse_prometheus(page("vllm_metrics.txt"))
    # the whole history: 51,000 tokens in 1,020 s of per-token time -> 50 tok/s
    assert vllm_load(first) == ServerLoad("vllm", 3, 2, None, pytest.approx(50.0))
    later = parse_prometheus(page("vllm_metrics_later.txt"))
    # since the first read: 1,000 tokens in 25 s -> 40 tok/s (the batch grew to 4)
    assert vllm_load(later, first) == ServerLoad("vllm", 4, 0, None, pytest.approx(40.0))
    assert vllm_load(first, first).tokens_per_s is None  # nothing generated in between


def test_llamacpp_from_metrics_and_slots() -> None:
    metrics = parse_prometheus(page("llamacpp_metrics.txt"))
    slots = parse_slots(page("llamacpp_slots.json"))
    load = llamacpp_load(metrics, slots)
    # 9,120 tokens over 182.4 s of prediction -> 50 tok/s per request
    assert load == ServerLoad("llamacpp", 2, 1, 4, pytest.approx(50.0))
    assert llamacpp_load(None, slots) == ServerLoad("llamacpp", 2, 0, 4)
    old = parse_slots(page("llamacpp_slots_old.json"))  # servers before `is_processing`
    assert llamacpp_load(None, old) == ServerLoad("llamacpp", 1, 0, 2)
    with pytest.raises(LoadFormatError):
        llamacpp_load(None, {"slots": 4})


def test_tgi_queue_batch_and_speed() -> None:
    load = tgi_load(parse_prometheus(page("tgi_metrics.txt")))
    assert load == ServerLoad("tgi", 8, 5, None, pytest.approx(40.0))  # 10 s / 400 tokens


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
    return Starlette(routes=[Route(p, serve) for p in ("/metrics", "/slots")])


@pytest.mark.anyio
@pytest.mark.parametrize(("pages", "source", "queue", "tps"), [
    ({"/metrics": "vllm_metrics.txt"}, "vllm", 2, 50.0),
    ({"/metrics": "tgi_metrics.txt"}, "tgi", 5, 40.0),
    ({"/metrics": "llamacpp_metrics.txt", "/slots": "llamacpp_slots.json"}, "llamacpp", 1,
     50.0),
    ({"/slots": "llamacpp_slots.json"}, "llamacpp", 0, 12.0),  # no --metrics: the prior
    ({}, "auto", 0, 12.0),  # nothing exported: queue 0 and the configured figure
])
async def test_the_reader_detects_the_server_over_http(pages: dict[str, str], source: str,
                                                       queue: int, tps: float) -> None:
    app = _server({path: page(name) for path, name in pages.items()})
    async with serve_app(app) as url, aiohttp.ClientSession() as session:
        reader = LoadReader(url + "/v1", "auto", 12.0)
        await reader.read_once(session)
    assert reader.source == source
    assert reader.announcement() == (queue, pytest.approx(tps))


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


def test_an_unknown_source_is_refused() -> None:
    with pytest.raises(ValueError, match="--load-from"):
        LoadReader("http://127.0.0.1:1", "ollama", 1.0)
