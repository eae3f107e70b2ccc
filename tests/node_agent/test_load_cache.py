"""A real server's prefix-cache state read as the node's prior: only what the engine says
that means it (recorded vLLM and llama.cpp pages, old and new formats, and malformed ones:
refused, counted, the load still read)."""

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
from node_agent.engines import MetricsPage, parse_slots, read_metrics
from node_agent.load import LoadReader
from node_agent.serving import serve_app

from .fakes import RecordingService

FIXTURES = Path(__file__).parent / "fixtures"


def metrics(name: str) -> MetricsPage:
    return read_metrics((FIXTURES / name).read_text())


def slots(name: str) -> Any:
    return parse_slots((FIXTURES / name).read_text())


def reader_after(*pages: str) -> LoadReader:
    reader = LoadReader("http://127.0.0.1:1/v1", "auto", 12.0)
    for name in pages:
        reader.take(metrics(name))
    return reader


def test_vllm_hit_rate_from_its_prefix_cache_counters() -> None:
    reader = reader_after("vllm_metrics_cache.txt")
    assert reader.cache_prior() == CachePrior(0.6)  # 120,000 of 200,000 tokens, all history
    reader.take(metrics("vllm_metrics_cache_later.txt"))
    assert reader.cache_prior() == CachePrior(pytest.approx(0.9))  # 9,000 of 10,000
    reader.take(metrics("vllm_metrics_cache_later.txt"))  # nothing queried: 0.9 stays
    assert reader.cache_prior() == CachePrior(pytest.approx(0.9))
    reader.take(metrics("vllm_metrics_cache.txt"))  # counters went back: a restart
    assert reader.hits.restarts == 1
    # the new process's whole history is its first window: 120,000 of 200,000
    assert reader.cache_prior() == CachePrior(0.6)
    assert reader_after("vllm_metrics.txt").cache_prior() is None  # no prefix-cache metrics


def test_the_older_vllm_hit_rate_gauge() -> None:
    assert reader_after("vllm_metrics_v0_hit_rate.txt").cache_prior() == CachePrior(0.4375)


def test_vllm_hits_above_queries_are_refused_and_the_load_kept(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "meshroute.node_agent"):
        reader = reader_after("vllm_metrics_cache_bad.txt")
    assert reader.cache_prior() is None and reader.rejected == 1
    assert "cache counters refused" in caplog.text
    assert reader.latest is not None and reader.latest.running == 3


@pytest.mark.parametrize(("name", "context"), [("llamacpp_slots_cache.json", 8192),
                                               ("llamacpp_slots_n_past.json", 4096),
                                               ("llamacpp_slots_cache_bad.json", 8192)])
def test_llamacpps_per_slot_prompt_figures_are_no_cache_claim(name: str, context: int) -> None:
    """`n_prompt_tokens`, `n_prompt_tokens_cache`, `n_past` describe each slot's last
    prompt: neither a capacity nor a hit rate. Only each slot's context is."""
    reader = LoadReader("http://127.0.0.1:1/v1", "llamacpp", 12.0)
    load = reader.take(None, slots(name))
    assert load is not None and load.cache == CachePrior(None, context)
    assert reader.rejected == 0


def _server(pages: dict[str, str]) -> Starlette:
    async def serve(request: Request) -> Response:
        text = pages.get(request.url.path)
        if text is None:
            return PlainTextResponse("not found", status_code=404)
        return PlainTextResponse(text)
    return Starlette(routes=[Route(p, serve) for p in ("/metrics", "/slots", "/props")])


@pytest.mark.anyio
@pytest.mark.parametrize(("pages", "cache"), [
    ({"/metrics": "vllm_metrics_cache.txt"}, CachePrior(0.6)),
    # llama.cpp with --metrics: its counters, 659 of 1,295 prompt tokens reused, and the
    # context of a slot from /props
    ({"/metrics": "llamacpp_real/metrics_busy.txt", "/slots": "llamacpp_real/slots_busy.json",
      "/props": "llamacpp_real/props.json"}, CachePrior(pytest.approx(659 / 1295), 4096)),
    ({"/slots": "llamacpp_slots_n_past.json"}, CachePrior(None, 4096)),
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
    """vLLM's /metrics page -> the node's reader -> its TXT record -> a tracker's
    discovery -> the node record the router reads, as `meshroute node --load-from` runs."""
    app = _server({"/metrics": (FIXTURES / "vllm_metrics_cache.txt").read_text()})
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
    assert route_prior(h.node.cache for h in route.hops) == CachePrior(0.6)
