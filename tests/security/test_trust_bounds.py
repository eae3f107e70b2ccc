"""Issue 11, item 7: bounded everything. Each test is a resource attack that worked before."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from typing import Any

import httpx
import pytest

from meshroute_middleware.api import GatewayAPI
from meshroute_middleware.app.gateway import Gateway, build_gateway
from meshroute_middleware.app.settings import ServeSettings, load_settings
from meshroute_middleware.core import NodeRecord, RouterConfig
from meshroute_middleware.telemetry.events import EventBus
from node_agent.discovery import Discovery
from node_agent.mdns import NODE_SERVICE, encode_record

from ..conftest import FakeClock

pytestmark = pytest.mark.anyio


def record(node_id: str, model: str = "m") -> NodeRecord:
    return NodeRecord(node_id, model, 0, 39, 40, f"http://127.0.0.1:9/{node_id}")


def gateway(**settings: Any) -> Gateway:
    base = replace(ServeSettings(mdns=False, seed=1, router=RouterConfig(explore_share=0.0)),
                   **settings)
    return build_gateway(base, clock=FakeClock())


def client(app: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw")


# -- nodes and models ---------------------------------------------------------------------
def test_max_nodes_is_a_setting_with_a_sane_default() -> None:
    assert ServeSettings().max_nodes == 1024
    assert load_settings({"max_nodes": 3}).max_nodes == 3
    assert load_settings({}, {"MESHROUTE_MAX_NODES": "7"}).max_nodes == 7
    with pytest.raises(ValueError, match="max_nodes"):
        load_settings({"max_nodes": 0})


async def test_http_registration_past_max_nodes_is_a_409() -> None:
    gw = gateway(max_nodes=3)
    async with client(gw.app) as c:
        for i in range(3):
            assert (await c.post("/v1/nodes", json=record(f"n{i}", f"m{i}").to_dict())
                    ).status_code == 201
        resp = await c.post("/v1/nodes", json=record("n3", "m3").to_dict())
        assert resp.status_code == 409 and resp.json()["error"]["code"] == "too_many_nodes"
        again = await c.post("/v1/nodes", json=record("n0", "m0").to_dict())
        assert again.status_code == 200  # a known node still refreshes
    assert gw.router.topology.size() == 3 and gw.router.models() == ["m0", "m1", "m2"]
    assert gw.telemetry.rejected["node-limit"] == 1


async def test_mdns_records_past_max_nodes_are_a_counted_drop() -> None:
    gw = gateway(max_nodes=2)
    discovery = Discovery(gw.mesh)
    for i in range(50):  # a flood of fresh ids, each its own model
        discovery.announced(f"n{i}.{NODE_SERVICE}", encode_record(record(f"n{i}", f"m{i}")))
    assert gw.router.topology.size() == 2 and len(gw.router.models()) == 2
    assert gw.telemetry.rejected["node-limit"] == 48
    assert len(discovery.services) == 2


async def test_a_model_whose_last_node_left_is_forgotten() -> None:
    gw = gateway()
    async with client(gw.app) as c:
        for i in range(20):
            await c.post("/v1/nodes", json=record(f"n{i}", f"m{i}").to_dict())
            await c.get("/v1/routing")
            assert (await c.delete(f"/v1/nodes/n{i}")).status_code == 200
    assert gw.router.topology.model("m0") is None and gw.router.models() == []
    assert gw.router._cache == {}  # nothing per model outlives the model


# -- event subscribers ----------------------------------------------------------------------
async def test_publishing_does_not_grow_with_idle_subscribers() -> None:
    """5,000 idle /v1/routing/events clients used to add ~14 ms to every chat request."""
    def publish_s(bus: EventBus) -> float:
        began = time.perf_counter()
        for i in range(200):
            bus.publish("node", {"n": i})
        return (time.perf_counter() - began) / 200

    alone, crowded = EventBus(), EventBus(max_subscribers=5000)
    streams = [crowded.subscribe() for _ in range(5000)]
    readers = [asyncio.ensure_future(anext(s)) for s in streams]
    await asyncio.sleep(0)  # every reader joined and waits
    assert crowded.subscriber_count == 5000
    baseline = min(publish_s(alone) for _ in range(3))
    loaded = min(publish_s(crowded) for _ in range(3))
    # Before: one queue put per subscriber per event (~3 µs x 5,000). After: one append.
    assert loaded < 20 * baseline + 5e-6, (loaded, baseline)
    assert not any(r.done() for r in readers)  # nothing was handed out on the way
    events = await asyncio.wait_for(asyncio.gather(*readers), 30)  # the one fan-out
    assert {e["n"] for e in events} == {0}
    for stream in streams:
        await stream.aclose()


async def test_subscribers_past_the_cap_close_the_oldest_counted() -> None:
    bus = EventBus(max_subscribers=2)
    first, second, third = bus.subscribe(), bus.subscribe(), bus.subscribe()
    pending = [asyncio.ensure_future(anext(s)) for s in (first, second)]
    await asyncio.sleep(0)
    bus.publish("node", {"n": 1})
    assert (await pending[0])["n"] == 1 and (await pending[1])["n"] == 1
    late = asyncio.ensure_future(anext(third))
    await asyncio.sleep(0)  # the third joins: the first (oldest) is closed
    with pytest.raises(StopAsyncIteration):
        await anext(first)
    assert bus.subscriber_count == 2 and bus.subscribers_dropped == 1
    assert (await late)["n"] == 1  # history, then live
    for stream in (second, third):
        await stream.aclose()


async def test_subscriber_counts_are_exported() -> None:
    gw = gateway()
    gw.telemetry.events.subscribers_dropped = 4
    text = gw.telemetry.render().decode()
    assert "meshroute_event_subscribers_dropped_total 4.0" in text
    assert "meshroute_event_subscribers 0.0" in text


# -- scrapes ----------------------------------------------------------------------------------
def wide_gateway(models: int) -> Gateway:
    gw = gateway(max_nodes=10_000)
    for i in range(models):
        for j in range(3):  # three heads each: a policy has something to choose
            gw.mesh.upsert(NodeRecord(f"n{i}-{j}", f"m{i}", 0, 39, 40,
                                      f"http://127.0.0.1:9/{i}/{j}", 10.0 + j))
    return gw


async def test_metrics_scrape_draws_no_monte_carlo() -> None:
    """3,000 models: one scrape used to block the loop for 2 s (400 draws per model)."""
    gw = wide_gateway(50)
    draws = 0
    choose = gw.router.policy.choose

    def counting(*args: Any) -> Any:
        nonlocal draws
        draws += 1
        return choose(*args)

    gw.router.policy.choose = counting  # type: ignore[method-assign]
    text = gw.telemetry.render().decode()
    assert draws == 0
    assert text.count("meshroute_route_weight{") == 150
    assert 'meshroute_nodes{model="m7"} 3.0' in text


async def test_metrics_and_routing_are_computed_at_most_once_a_second() -> None:
    gw = wide_gateway(3)
    ticks = FakeClock(0.0)
    api = GatewayAPI(gw.mesh, clock=ticks)
    calls = {"routing": 0, "render": 0}
    table, render = gw.router.routing_table, gw.telemetry.render

    def counted_table(model: str | None = None) -> dict[str, Any]:
        calls["routing"] += 1
        return table(model)

    def counted_render(per_client: bool = True) -> bytes:
        calls["render"] += 1
        return render(per_client)

    gw.router.routing_table = counted_table  # type: ignore[method-assign]
    gw.telemetry.render = counted_render  # type: ignore[method-assign]
    from meshroute_middleware.api import build_api_app
    async with client(build_api_app(api)) as c:
        for _ in range(20):
            assert (await c.get("/v1/routing")).status_code == 200
            assert (await c.get("/metrics")).status_code == 200
        assert calls == {"routing": 1, "render": 1}
        ticks.advance(1.0)
        first = (await c.get("/v1/routing")).json()
        await c.get("/metrics")
        assert calls == {"routing": 2, "render": 2}
        assert set(first["models"]) == {"m0", "m1", "m2"}
        assert (await c.get("/v1/routing?model=m1")).json()["models"].keys() == {"m1"}
        assert calls["routing"] == 3  # a per-model query is its own cache entry


async def test_a_whole_routing_table_has_a_bounded_draw_budget() -> None:
    """/v1/routing over many models drew 400 Monte-Carlo choices per model (seconds)."""
    gw = wide_gateway(200)
    draws = 0
    choose = gw.router.policy.choose

    def counting(*args: Any) -> Any:
        nonlocal draws
        draws += 1
        return choose(*args)

    gw.router.policy.choose = counting  # type: ignore[method-assign]
    table = gw.router.routing_table()
    assert draws <= 4000 and table["models"]["m0"]["share_basis"] == "sampled"
    assert sum(r["share"] for r in table["models"]["m0"]["candidates"]) == pytest.approx(1.0)
    draws = 0
    gw.router.routing_table("m0")  # one model keeps the full 400 draws
    assert draws == 400


# -- a server's prefix-cache report (issue 26) ---------------------------------------------
async def test_a_hostile_cache_report_is_a_400_counted_and_a_good_one_is_kept() -> None:
    gw = gateway()
    good = {**record("n0").to_dict(), "cache_hit": 0.75, "cache_tokens": 4096}
    async with client(gw.app) as c:
        for bad in ({"cache_hit": 7}, {"cache_tokens": -5}, {"cache_hit": "NaN"}):
            resp = await c.post("/v1/nodes", json={**good, **bad})
            assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_node"
        assert (await c.post("/v1/nodes", json=good)).status_code == 201
        listed = (await c.get("/v1/nodes")).json()["nodes"]
    assert gw.telemetry.rejected["http"] == 3
    assert [(n["cache_hit"], n["cache_tokens"]) for n in listed] == [(0.75, 4096)]
    discovery = Discovery(gw.mesh)
    props = encode_record(record("n1"))
    discovery.announced(f"n1.{NODE_SERVICE}", {**props, "ch": "1.5"})
    assert gw.router.topology.node("n1") is None and gw.telemetry.rejected["mdns"] == 1


# -- a server's slot count -------------------------------------------------------------------
async def test_a_hostile_slot_count_is_a_400_counted_and_a_good_one_is_kept() -> None:
    gw = gateway()
    good = {**record("n0").to_dict(), "slots": 8}
    async with client(gw.app) as c:
        for bad in (0, 65537, True, 2.5, "٤", "1e3", [8]):
            resp = await c.post("/v1/nodes", json={**good, "slots": bad})
            assert resp.status_code == 400 and resp.json()["error"]["code"] == "invalid_node"
            assert "'slots' must be an integer in 1..65536" in resp.json()["error"]["message"]
        assert (await c.post("/v1/nodes", json=good)).status_code == 201
        listed = (await c.get("/v1/nodes")).json()["nodes"]
    assert gw.telemetry.rejected["http"] == 7
    assert [n["slots"] for n in listed] == [8]
    (route,) = gw.router.candidates("m")
    assert route.slots == 8
    discovery = Discovery(gw.mesh)
    props = encode_record(record("n1"))
    discovery.announced(f"n1.{NODE_SERVICE}", {**props, "sl": "0"})
    assert gw.router.topology.node("n1") is None and gw.telemetry.rejected["mdns"] == 1
    discovery.announced(f"n1.{NODE_SERVICE}", {**props, "sl": "16"})
    node = gw.router.topology.node("n1")
    assert node is not None and node.slots == 16
