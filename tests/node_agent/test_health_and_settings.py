"""Health-check bookkeeping, probes, announcement rate limits, mDNS helpers, CLI settings."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from zeroconf import InterfaceChoice

from meshroute_middleware.core import NodeRecord
from meshroute_middleware.core.contracts.txt import encode_tracker
from node_agent.announcer import (
    NodeAnnouncer,
    meaningful_change,
    parse_tracker,
)
from node_agent.cli import node_settings, reachable_url
from node_agent.discovery import FORGET_AFTER_MISSES, MISSES_TO_REMOVE, Discovery
from node_agent.mdns import MAX_LABEL_BYTES, instance_name, parse_interfaces
from node_agent.serving import serve_app

from ..conftest import FakeClock
from .conftest import RecordingSink
from .fakes import RecordingService

NODE = NodeRecord("n1", "m", 0, 3, 4, "http://127.0.0.1:9", tps=40.0)


def test_three_misses_remove_and_an_answer_brings_back(sink: RecordingSink) -> None:
    discovery = Discovery(sink)
    sink.upsert(NODE)
    for _ in range(MISSES_TO_REMOVE - 1):
        discovery.apply_probe(NODE, ok=False)
    assert "n1" in sink.records
    discovery.apply_probe(NODE, ok=False)
    assert "n1" not in sink.records and "n1" in discovery.down
    discovery.apply_probe(NODE, ok=False)  # still dead: not removed twice
    assert [entry[1] for entry in sink.log].count("remove") == 1
    discovery.apply_probe(NODE, ok=True)
    assert sink.records["n1"] == NODE and discovery.down == {}


def test_a_miss_streak_is_reset_by_an_answer(sink: RecordingSink) -> None:
    discovery = Discovery(sink)
    sink.upsert(NODE)
    for ok in (False, False, True, False, False):
        discovery.apply_probe(NODE, ok)
    assert "n1" in sink.records


def test_long_dead_nodes_are_forgotten(sink: RecordingSink) -> None:
    discovery = Discovery(sink)
    for _ in range(FORGET_AFTER_MISSES):
        discovery.apply_probe(NODE, ok=False)
    assert discovery.down == {} and discovery.misses == {}


@pytest.mark.anyio
async def test_probe_counts_any_http_answer_and_not_a_refusal(sink: RecordingSink) -> None:
    async def broken(request: Any) -> PlainTextResponse:
        return PlainTextResponse("down for maintenance", status_code=500)

    app = Starlette(routes=[Route("/v1/models", broken)])
    discovery = Discovery(sink, health_interval_s=0.5)
    async with serve_app(app) as url, aiohttp.ClientSession() as session:
        assert await discovery.probe(session, url)  # a 500 still proves the process is up
    async with aiohttp.ClientSession() as session:
        assert not await discovery.probe(session, url)  # nothing listens any more



@pytest.mark.anyio
async def test_refresh_is_rate_limited_and_ignores_noise(clock: FakeClock) -> None:
    announcer = NodeAnnouncer(NODE, interfaces="127.0.0.1", min_interval_s=1.0, clock=clock)
    stub = RecordingService()
    announcer._service = stub  # type: ignore[assignment]
    assert not await announcer.refresh(queue=0, tps=42.0)  # +5 %: noise
    assert await announcer.refresh(queue=2, tps=40.0)
    clock.advance(0.5)
    assert not await announcer.refresh(queue=3, tps=40.0)  # too soon
    clock.advance(0.6)
    assert await announcer.refresh(queue=3, tps=40.0)
    assert announcer.record.queue == 3 and len(stub.sent) == 2


@pytest.mark.parametrize(("changes", "news"), [
    ({}, False), ({"tps": 43.9}, False), ({"tps": 44.5}, True), ({"tps": 35.0}, True),
    ({"queue": 1}, True), ({"end": 2}, True),
])
def test_meaningful_change(changes: dict[str, Any], news: bool) -> None:
    assert meaningful_change(NODE, replace(NODE, **changes)) is news


def test_parse_interfaces() -> None:
    assert parse_interfaces("all") is InterfaceChoice.All
    assert parse_interfaces("127.0.0.1, 10.0.0.2") == ["127.0.0.1", "10.0.0.2"]
    for bad in ("", "eth0", "127.0.0.1,nope"):
        with pytest.raises(ValueError):
            parse_interfaces(bad)


def test_instance_names_fit_one_label() -> None:
    long_id = "n" * 128
    label = instance_name(long_id, "_meshroute._tcp.local.").split(".")[0]
    assert len(label.encode()) <= MAX_LABEL_BYTES
    assert instance_name(long_id, "x") != instance_name(long_id[:-1] + "m", "x")


def test_tracker_records_are_signed_with_the_mesh_secret() -> None:
    signed = {k.encode(): v.encode() for k, v in encode_tracker("t", 80, 7000, "s").items()}
    assert parse_tracker(signed, ["10.0.0.2"], "s") == ("t", "10.0.0.2", 7000)
    forged = {**signed, b"gp": b"7001"}
    for props, secret in ((forged, "s"), (signed, "other"), ({**signed, b"sig": b""}, "s")):
        with pytest.raises(ValueError, match="signature"):
            parse_tracker(props, ["10.0.0.2"], secret)


@pytest.mark.parametrize(("props", "error"), [
    ({b"v": b"1", b"id": b"t", b"gp": b"7000"}, None),
    ({b"v": b"2", b"id": b"t", b"gp": b"7000"}, "version"),
    ({b"v": b"1", b"id": b"t", b"gp": b"99999"}, "port"),
    ({b"v": b"1", b"gp": b"7000"}, "id"),
    ({b"v": b"1", b"id": b"\xff", b"gp": b"7000"}, "UTF-8"),
])
def test_parse_tracker(props: dict[bytes, bytes], error: str | None) -> None:
    if error is None:
        assert parse_tracker(props, ["127.0.0.1"]) == ("t", "127.0.0.1", 7000)
    else:
        with pytest.raises(ValueError, match=error):
            parse_tracker(props, ["127.0.0.1"])


def test_node_settings_flags_over_env() -> None:
    env = {"MESHROUTE_NODE_MODEL": "qwen", "MESHROUTE_MESH_SECRET": "s",
           "MESHROUTE_MDNS_INTERFACES": "127.0.0.1", "MESHROUTE_NODE_LAYERS": "40"}
    s = node_settings({"shard": "22-39", "url": "http://10.0.0.5:8000", "model": "flag"}, env)
    assert (s.model, s.start, s.end, s.layers, s.mesh_secret) == ("flag", 22, 39, 40, "s")
    assert s.mdns_interfaces == "127.0.0.1" and not s.emulate


@pytest.mark.parametrize(("cli", "needle"), [
    ({"shard": "0-3", "layers": 4, "url": "http://h:1"}, "--model"),
    ({"model": "m", "layers": 4, "url": "http://h:1"}, "--shard"),
    ({"model": "m", "shard": "0-3", "layers": 4}, "--url"),
    ({"model": "m", "shard": "zero", "layers": 4, "url": "http://h:1"}, "START-END"),
    ({"emulate": True, "mdns_interfaces": "eth0"}, "not an IP address"),
])
def test_node_settings_errors(cli: dict[str, Any], needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        node_settings(cli, {})


def test_emulate_needs_nothing_else() -> None:
    s = node_settings({"emulate": True, "slots": 2}, {})
    assert (s.model, s.start, s.end, s.layers, s.knobs) == ("emu-model", 0, 31, 32,
                                                            {"slots": 2})


def test_public_exports() -> None:
    import node_agent

    assert sorted(node_agent.__all__) == sorted([
        "NODE_SERVICE", "TRACKER_SERVICE", "Discovery", "EmulatedNode", "EmulatorConfig",
        "NodeAnnouncer", "TopologySink", "TrackerAnnouncer", "decode_record", "encode_record",
        "health_checks", "serve_node", "tracker_discovery"])
    assert all(hasattr(node_agent, name) for name in node_agent.__all__)


def test_reachable_url_replaces_a_wildcard_listen_address() -> None:
    assert reachable_url("http://127.0.0.1:8000", "all") == "http://127.0.0.1:8000"
    assert reachable_url("http://0.0.0.0:8000", "10.1.2.3") == "http://10.1.2.3:8000"
