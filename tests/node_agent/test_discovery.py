"""Discovery with real multicast on loopback: node processes, goodbyes, kill -9, signatures."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable

import aiohttp
import anyio
import pytest
from zeroconf import ServiceInfo, ServiceStateChange

from meshroute_middleware.core import NodeRecord
from node_agent.announcer import NodeAnnouncer, _Registered
from node_agent.discovery import EVENT_BUFFER, MISSES_TO_REMOVE, Discovery, tracker_discovery
from node_agent.emulator import EmulatorConfig, serve_node
from node_agent.mdns import NODE_SERVICE, encode_record, service_info

from .conftest import LOOPBACK, PATIENCE_S, RecordingSink

pytestmark = pytest.mark.anyio

Start = Callable[..., subprocess.Popen[str]]


async def test_node_process_found_then_removed_by_goodbye_and_by_health(
        sink: RecordingSink, node_processes: Start) -> None:
    interval_s = 0.3
    async with tracker_discovery(sink, interfaces=LOOPBACK,
                                 health_interval_s=interval_s) as discovery:
        polite, killed = node_processes("polite"), node_processes("killed", "--slots", "3")
        await sink.wait_for(lambda: {"polite", "killed"} <= set(sink.records),
                            PATIENCE_S)
        record = sink.records["killed"]
        assert (record.model, record.start, record.end, record.layers) == (
            "emu-model", 0, 31, 32)
        assert (record.slots, sink.records["polite"].slots) == (3, 4)  # --slots, the default
        async with aiohttp.ClientSession() as session, \
                session.get(record.url + "/v1/models") as resp:
            assert resp.status == 200  # the announced URL is the emulator itself

        polite.send_signal(signal.SIGTERM)
        await sink.wait_for(lambda: "polite" not in sink.records, PATIENCE_S)
        assert polite.wait(PATIENCE_S) == 0
        assert "polite" not in discovery.down  # the goodbye removed it, not health checks

        killed.kill()
        dead_s = await sink.wait_for(lambda: "killed" not in sink.records, PATIENCE_S)
        assert "killed" in discovery.down  # removed by health checks: no goodbye after -9
    assert dead_s >= (MISSES_TO_REMOVE - 1) * interval_s  # not before the probes missed
    assert sink.rejections == []


async def test_dead_node_comes_back_when_it_answers(sink: RecordingSink) -> None:
    config = EmulatorConfig(node_id="phoenix")
    async with serve_node(config) as (_, url):
        port = int(url.rsplit(":", 1)[1])
    record = NodeRecord("phoenix", config.model, 0, 31, 32, url)
    async with tracker_discovery(sink, interfaces=LOOPBACK,
                                 health_interval_s=0.2) as discovery, \
            NodeAnnouncer(record, interfaces=LOOPBACK):
        # Nothing listens at the URL: found over mDNS, then removed by three missed probes
        # (possibly before the announcer has finished registering, so watch the log).
        await sink.wait_for(lambda: "phoenix" in discovery.down, PATIENCE_S)
        assert [e[1:] for e in sink.log] == [("upsert", "phoenix"), ("remove", "phoenix")]
        async with serve_node(config, LOOPBACK, port):
            await sink.wait_for(lambda: "phoenix" in sink.records, PATIENCE_S)
        assert discovery.down == {}


def _forged(record: NodeRecord, secret: str) -> ServiceInfo:
    props = encode_record(record, secret)
    props["q"] = "0" if record.queue else "1"  # changed after signing
    return service_info(NODE_SERVICE, record.node_id, record.url, props, LOOPBACK)


async def test_mesh_secret_accepts_signed_and_rejects_the_rest(sink: RecordingSink) -> None:
    secret = "s3cret"
    signed = NodeRecord("signed", "m", 0, 3, 4, "http://127.0.0.1:9")
    unsigned = NodeRecord("unsigned", "m", 0, 3, 4, "http://127.0.0.1:9")
    forged = NodeRecord("forged", "m", 0, 3, 4, "http://127.0.0.1:9")
    other = NodeRecord("other-mesh", "m", 0, 3, 4, "http://127.0.0.1:9")
    fake = _Registered(LOOPBACK)
    announcers = [NodeAnnouncer(signed, interfaces=LOOPBACK, mesh_secret=secret),
                  NodeAnnouncer(unsigned, interfaces=LOOPBACK),
                  NodeAnnouncer(other, interfaces=LOOPBACK, mesh_secret="not-ours")]
    async with tracker_discovery(sink, interfaces=LOOPBACK, mesh_secret=secret,
                                 health_interval_s=60):
        try:
            async with anyio.create_task_group() as tg:  # register concurrently: ~1.2 s each
                for announcer in announcers:
                    tg.start_soon(announcer.start)
                tg.start_soon(fake.register, _forged(forged, secret))
            await sink.wait_for(lambda: len(set(sink.rejections)) >= 3 and bool(sink.records),
                                PATIENCE_S)
            assert set(sink.records) == {"signed"}
        finally:
            for closing in [*announcers, fake]:
                await closing.close()
    assert {source for source, _ in sink.rejections} == {"mdns"}
    reasons = {why.split(".")[0]: why for _, why in sink.rejections}
    assert "unsigned" in reasons["unsigned"]
    assert "signature" in reasons["forged"]
    assert "signature" in reasons["other-mesh"]


async def test_hostile_txt_is_rejected_not_trusted(sink: RecordingSink) -> None:
    hostile = ServiceInfo(NODE_SERVICE, "evil." + NODE_SERVICE, port=9,
                          properties={b"v": b"1", b"id": b"evil", b"m": b"\xff\xfe",
                                      b"s": b"0", b"e": b"99", b"l": b"4", b"u": b"ftp://x"},
                          server="evil.local.", parsed_addresses=[LOOPBACK])
    fake = _Registered(LOOPBACK)
    async with tracker_discovery(sink, interfaces=LOOPBACK, health_interval_s=60):
        await fake.register(hostile)
        try:
            await sink.wait_for(lambda: bool(sink.rejections), PATIENCE_S)
        finally:
            await fake.close()
    assert sink.records == {}
    assert "UTF-8" in sink.rejections[0][1]


async def test_trackers_find_each_other_as_gossip_peers(sink: RecordingSink) -> None:
    seen_by_a: list[tuple[str, int]] = []
    seen_by_b: list[tuple[str, int]] = []
    gone_from_a: list[tuple[str, int]] = []

    def record(into: list[tuple[str, int]]) -> Callable[[str, int], None]:
        return lambda host, port: into.append((host, port))

    mesh = {"interfaces": LOOPBACK, "health_interval_s": 60, "mesh_secret": "ours"}
    async with tracker_discovery(sink, announce_http_port=8001, announce_gossip_port=7001,
                                 tracker_id="tracker-a", on_tracker=record(seen_by_a),
                                 on_tracker_gone=record(gone_from_a), **mesh):
        async with tracker_discovery(RecordingSink(), announce_http_port=8002,
                                     announce_gossip_port=7002, tracker_id="tracker-b",
                                     on_tracker=record(seen_by_b), **mesh), \
                tracker_discovery(RecordingSink(), interfaces=LOOPBACK, health_interval_s=60,
                                  mesh_secret="theirs", announce_http_port=8003,
                                  announce_gossip_port=7003, tracker_id="rogue"):
            await sink.wait_for(lambda: bool(seen_by_a and seen_by_b and sink.rejections),
                                PATIENCE_S)
        await sink.wait_for(lambda: bool(gone_from_a), PATIENCE_S)
    assert seen_by_a == [(LOOPBACK, 7002)] and seen_by_b == [(LOOPBACK, 7001)]
    assert gone_from_a == [(LOOPBACK, 7002)]
    assert sink.rejections[0][0] == "mdns-tracker" and "rogue" in sink.rejections[0][1]


async def test_load_updates_reach_the_tracker(sink: RecordingSink) -> None:
    record = NodeRecord("busy", "m", 0, 3, 4, "http://127.0.0.1:9", tps=50.0)
    async with tracker_discovery(sink, interfaces=LOOPBACK, health_interval_s=60), \
            NodeAnnouncer(record, interfaces=LOOPBACK, min_interval_s=0.0) as announcer:
        await sink.wait_for(lambda: "busy" in sink.records, PATIENCE_S)
        assert await announcer.refresh(queue=5, tps=20.0)
        await sink.wait_for(lambda: sink.records["busy"].queue == 5, PATIENCE_S)
        assert sink.records["busy"].tps == 20.0
        assert not await announcer.refresh(queue=5, tps=21.0)  # under 10 %: not news


async def test_a_browse_event_flood_is_counted_not_silently_dropped(
        sink: RecordingSink) -> None:
    discovery = Discovery(sink)
    for i in range(EVENT_BUFFER + 3):
        discovery.on_change(None, NODE_SERVICE, f"n{i}.{NODE_SERVICE}", ServiceStateChange.Added)
    assert [source for source, _ in sink.rejections] == ["mdns-overflow"] * 3
    assert "queue full" in sink.rejections[0][1]
