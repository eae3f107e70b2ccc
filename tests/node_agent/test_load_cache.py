"""A real server's prefix-cache state read as the node's prior: recorded vLLM and llama.cpp
pages, old and new formats, and malformed ones (refused, counted, the load still read)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import NodeRecord
from meshroute_middleware.core.cache_prior import CachePrior, route_prior
from meshroute_middleware.core.contracts.txt import NODE_SERVICE
from node_agent.announcer import NodeAnnouncer, announced_cache
from node_agent.discovery import Discovery
from node_agent.load import (
    LoadFormatError,
    LoadReader,
    llamacpp_cache,
    parse_prometheus,
    parse_slots,
    server_cache,
    vllm_cache,
)
from node_agent.serving import serve_app

from .fakes import RecordingService

FIXTURES = Path(__file__).parent / "fixtures"


def metrics(name: str) -> dict[str, float]:
    return parse_prometheus((FIXTURES / name).read_text())


def slots(name: str) -> Any:
    return parse_slots((FIXTURES / name).read_text())


def test_vllm_hit_rate_from_its_prefix_cache_counters() -> None:
    first = metrics("vllm_metrics_cache.txt")
    assert vllm_cache(first) == CachePrior(0.6)  # 120,000 of 200,000 tokens, all history
    later = metrics("vllm_metrics_cache_later.txt")
    assert vllm_cache(later, first) == CachePrior(pytest.approx(0.9))  # 9,000 of 10,000
    assert vllm_cache(later, later) is None  # nothing queried in between
    assert vllm_cache(first, later) is None  # counters went back: a restart, no reading
    assert vllm_cache(metrics("vllm_metrics.txt")) is None  # no prefix-cache metrics


def test_the_older_vllm_hit_rate_gauge() -> None:
    assert vllm_cache(metrics("vllm_metrics_v0_hit_rate.txt")) == CachePrior(0.4375)
    with pytest.raises(LoadFormatError, match="hit_rate"):
        vllm_cache({"vllm:gpu_prefix_cache_hit_rate": 3.0})


def test_vllm_hits_above_queries_are_refused() -> None:
    with pytest.raises(LoadFormatError, match="above"):
        vllm_cache(metrics("vllm_metrics_cache_bad.txt"))
    with pytest.raises(LoadFormatError, match="finite"):
        vllm_cache({"vllm:prefix_cache_hits_total": float("inf"),
                    "vllm:prefix_cache_queries_total": 5.0})


def test_llamacpp_slots_newer_format() -> None:
    # 3,900 of 4,210 + 0 of 1,790 prompt tokens were cached; the fullest slot holds 4,210
    assert llamacpp_cache(slots("llamacpp_slots_cache.json")) == CachePrior(0.65, 4210)


def test_llamacpp_slots_older_formats() -> None:
    # n_past in next_token: tokens held, no hit rate
    assert llamacpp_cache(slots("llamacpp_slots_n_past.json")) == CachePrior(None, 1540)
    assert llamacpp_cache(slots("llamacpp_slots_old.json")) is None  # says nothing of it
    assert llamacpp_cache(slots("llamacpp_slots.json")) is None


@pytest.mark.parametrize("page", [
    [{"id": 0, "n_prompt_tokens": "4210", "n_prompt_tokens_cache": 3}],
    [{"id": 0, "n_prompt_tokens": 10, "n_prompt_tokens_cache": -1}],
    [{"id": 0, "n_prompt_tokens": True}],
    [{"id": 0, "n_past": 10**12}],
    [{"id": 0, "next_token": {"n_past": 1.5}}],
    {"slots": []},
    [3],
])
def test_malformed_llamacpp_slots_are_refused(page: Any) -> None:
    with pytest.raises(LoadFormatError):
        llamacpp_cache(page)


def test_malformed_recorded_slots_page_is_refused() -> None:
    with pytest.raises(LoadFormatError, match="above"):
        llamacpp_cache(slots("llamacpp_slots_cache_bad.json"))


def test_the_reader_keeps_the_load_and_drops_a_malformed_cache_report(
        caplog: pytest.LogCaptureFixture) -> None:
    reader = LoadReader("http://127.0.0.1:1/v1", "llamacpp", 12.0)
    with caplog.at_level(logging.WARNING, "meshroute.node_agent"):
        load = reader.take(None, slots("llamacpp_slots_cache_bad.json"))
    assert load is not None and load.running == 1 and load.slots == 4
    assert load.cache is None and reader.cache_prior() is None
    assert reader.rejected == 1 and "cache state refused" in caplog.text
    reader.take(None, slots("llamacpp_slots_cache.json"))
    assert reader.cache_prior() == CachePrior(0.65, 4210) and reader.rejected == 1


def test_server_cache_reads_the_page_each_server_exports() -> None:
    assert server_cache("vllm", metrics("vllm_metrics_cache.txt"), None) == CachePrior(0.6)
    assert server_cache("tgi", metrics("tgi_metrics.txt"), None) is None
    assert server_cache("llamacpp", None, None) is None


def _server(pages: dict[str, str]) -> Starlette:
    async def serve(request: Request) -> Response:
        text = pages.get(request.url.path)
        if text is None:
            return PlainTextResponse("not found", status_code=404)
        return PlainTextResponse(text)
    return Starlette(routes=[Route(p, serve) for p in ("/metrics", "/slots")])


@pytest.mark.anyio
@pytest.mark.parametrize(("pages", "cache"), [
    ({"/metrics": "vllm_metrics_cache.txt"}, CachePrior(0.6)),
    # llama.cpp with --metrics: /slots is still read, for its cache state
    ({"/metrics": "llamacpp_metrics.txt", "/slots": "llamacpp_slots_cache.json"},
     CachePrior(0.65, 4210)),
    ({"/slots": "llamacpp_slots_n_past.json"}, CachePrior(None, 1540)),
    ({"/metrics": "vllm_metrics.txt"}, None),
])
async def test_the_reader_reads_the_cache_state_over_http(pages: dict[str, str],
                                                          cache: CachePrior | None) -> None:
    app = _server({path: (FIXTURES / name).read_text() for path, name in pages.items()})
    async with serve_app(app) as url, aiohttp.ClientSession() as session:
        reader = LoadReader(url + "/v1", "auto", 12.0)
        await reader.read_once(session)
    assert reader.cache_prior() == cache


def test_a_small_drift_of_the_hit_rate_is_not_news() -> None:
    old = CachePrior(0.6, 4000)
    assert announced_cache(old, CachePrior(0.62, 4100)) is old
    assert announced_cache(old, CachePrior(0.7, 4000)) == CachePrior(0.7, 4000)
    assert announced_cache(old, CachePrior(0.6, 5000)) == CachePrior(0.6, 5000)
    assert announced_cache(None, CachePrior(0.61234, None)) == CachePrior(0.61, None)
    assert announced_cache(old, None) is None



@pytest.mark.anyio
async def test_the_announcer_sends_the_cache_report_in_the_txt_record() -> None:
    record = NodeRecord("n", "m", 0, 31, 32, "http://127.0.0.1:9", 10.0)
    t = [0.0]
    announcer = NodeAnnouncer(record, interfaces="127.0.0.1", min_interval_s=1.0,
                              clock=lambda: t[0])
    service = RecordingService()
    announcer._service = service  # type: ignore[assignment]
    t[0] = 5.0
    assert await announcer.refresh(0, 10.0, CachePrior(0.6, 4210))
    assert announcer.record.cache == CachePrior(0.6, 4210)
    props = service.sent[-1].properties
    assert props[b"ch"] == b"0.6" and props[b"ck"] == b"4210"
    t[0] = 10.0
    assert not await announcer.refresh(0, 10.0, CachePrior(0.61, 4210))  # noise
    assert await announcer.refresh(0, 10.0)  is False  # no report given: the last one stays
    assert announcer.record.cache == CachePrior(0.6, 4210)


@pytest.mark.anyio
async def test_a_servers_cache_state_reaches_the_trackers_router() -> None:
    """llama.cpp's /slots page -> the node's reader -> its TXT record -> a tracker's
    discovery -> the node record the router reads, as `meshroute node --load-from` runs."""
    app = _server({"/slots": (FIXTURES / "llamacpp_slots_cache.json").read_text()})
    async with serve_app(app) as url, aiohttp.ClientSession() as session:
        reader = LoadReader(url + "/v1", "auto", 12.0)
        await reader.read_once(session)
    record = NodeRecord("n", "m", 0, 31, 32, "http://127.0.0.1:9", 12.0)
    announcer = NodeAnnouncer(record, interfaces="127.0.0.1", clock=lambda: 10.0)
    service = RecordingService()
    announcer._service = service  # type: ignore[assignment]
    assert await announcer.refresh(*reader.announcement(), reader.cache_prior())
    gw = build_gateway(ServeSettings(mdns=False, seed=1))
    Discovery(gw.mesh).announced(f"n.{NODE_SERVICE}", service.sent[-1].properties)
    (route,) = gw.router.candidates("m")
    assert route_prior(h.node.cache for h in route.hops) == CachePrior(0.65, 4210)
