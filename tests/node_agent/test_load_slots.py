"""A node's slot count: the emulator's own, llama.cpp's /slots, or the operator's --slots
(which wins), announced in the TXT record and refreshed when it changes."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from meshroute_middleware.core import NodeRecord
from node_agent.announcer import NodeAnnouncer
from node_agent.cli import _serve, node_record, node_settings
from node_agent.discovery import tracker_discovery
from node_agent.engines import parse_slots, read_metrics
from node_agent.load import LoadReader
from node_agent.serving import serve_app

from .conftest import LOOPBACK, PATIENCE_S, RecordingSink
from .fakes import RecordingService

FIXTURES = Path(__file__).parent / "fixtures"


def slots(name: str) -> Any:
    return parse_slots((FIXTURES / name).read_text())


@pytest.mark.parametrize(("name", "count"), [
    ("llamacpp_slots.json", 4), ("llamacpp_slots_old.json", 2),
    ("llamacpp_slots_cache.json", 4),
])
def test_the_reader_takes_llamacpps_slot_count(name: str, count: int) -> None:
    reader = LoadReader("http://127.0.0.1:1/v1", "llamacpp", 12.0)
    assert reader.slot_count() is None  # nothing read yet
    reader.take(None, slots(name))
    assert reader.slot_count() == count and reader.rejected == 0


def test_vllm_says_no_slot_count() -> None:
    reader = LoadReader("http://127.0.0.1:1/v1", "auto", 12.0)
    reader.take(read_metrics((FIXTURES / "vllm_metrics.txt").read_text()))
    assert reader.latest is not None and reader.slot_count() is None


def test_llamacpps_props_give_the_slot_count_and_sglang_its_batch() -> None:
    reader = LoadReader("http://127.0.0.1:1/v1", "llamacpp", 12.0)
    reader.take(None, None, {"total_slots": 3, "default_generation_settings": {"n_ctx": 512}})
    assert reader.slot_count() == 3
    sglang = LoadReader("http://127.0.0.1:1/v1", "auto", 12.0)
    sglang.take(read_metrics("sglang:num_running_reqs 1\nsglang:max_running_requests 64\n"))
    assert sglang.slot_count() == 64


def test_an_empty_slots_page_is_no_count_counted_and_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    reader = LoadReader("http://127.0.0.1:1/v1", "llamacpp", 12.0)
    with caplog.at_level(logging.WARNING, "meshroute.node_agent"):
        load = reader.take(None, [])
    assert load is not None and load.slots is None and reader.slot_count() is None
    assert reader.rejected == 1 and "slot count refused" in caplog.text



@pytest.mark.anyio
async def test_the_announcer_sends_a_changed_slot_count() -> None:
    t = [0.0]
    announcer = NodeAnnouncer(NodeRecord("n", "m", 0, 31, 32, "http://127.0.0.1:9", 10.0),
                              interfaces=LOOPBACK, clock=lambda: t[0])
    service = RecordingService()
    announcer._service = service  # type: ignore[assignment]
    t[0] = 5.0
    assert await announcer.refresh(0, 10.0, slots=4)
    assert announcer.record.slots == 4 and service.sent[-1].properties[b"sl"] == b"4"
    t[0] = 10.0
    assert not await announcer.refresh(0, 10.0, slots=4)  # unchanged: no packet
    assert not await announcer.refresh(0, 10.0)  # not given: the last one stays
    assert announcer.record.slots == 4
    assert await announcer.refresh(0, 10.0, slots=None)  # the server stopped saying
    assert announcer.record.slots is None and b"sl" not in service.sent[-1].properties


@pytest.mark.parametrize(("cli", "environ", "slots"), [
    ({}, {}, None),
    ({"slots": 16}, {}, 16),
    ({}, {"MESHROUTE_NODE_SLOTS": "64"}, 64),
    ({"slots": 16}, {"MESHROUTE_NODE_SLOTS": "64"}, 16),  # the flag wins
])
def test_slots_from_the_flag_or_its_variable(cli: dict[str, Any], environ: dict[str, str],
                                              slots: int | None) -> None:
    s = node_settings({"model": "m", "url": "http://127.0.0.1:8000", **cli}, environ)
    assert s.slots == slots
    assert node_record(s, "http://127.0.0.1:8000", None, 10.0, s.slots).slots == slots


@pytest.mark.parametrize(("cli", "environ", "needle"), [
    ({"slots": 0}, {}, "--slots must be an integer in 1..65536"),
    ({"slots": 65537}, {}, "--slots must be an integer in 1..65536"),
    ({}, {"MESHROUTE_NODE_SLOTS": "many"}, "MESHROUTE_NODE_SLOTS must be int"),
])
def test_bad_slots_are_refused_at_start(cli: dict[str, Any], environ: dict[str, str],
                                        needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        node_settings({"model": "m", "url": "http://127.0.0.1:8000", **cli}, environ)


def test_the_emulators_slots_knob_is_the_stated_count() -> None:
    s = node_settings({"emulate": True, "slots": 2}, {})
    assert s.knobs == {"slots": 2} and s.slots == 2
    env = node_settings({"emulate": True}, {"MESHROUTE_NODE_SLOTS": "3"})
    assert env.knobs == {"slots": 3}


def _llamacpp() -> Starlette:
    pages = {"/metrics": (FIXTURES / "llamacpp_metrics.txt").read_text(),
             "/slots": (FIXTURES / "llamacpp_slots.json").read_text(),
             "/v1/v1/models": '{"object": "list", "data": []}'}  # the health probe

    async def serve(request: Request) -> Response:
        return PlainTextResponse(pages[request.url.path])
    return Starlette(routes=[Route(p, serve) for p in pages])


@pytest.mark.anyio
@pytest.mark.parametrize(("cli", "slots"), [
    ({"emulate": True, "slots": 3}, 3),  # the emulator's batch
    ({"emulate": True}, 4),  # its default batch
    ({}, 4),  # llama.cpp's /slots lists 4
    ({"slots": 8}, 8),  # the operator's count wins over the page's
])
async def test_meshroute_node_announces_its_slot_count(sink: RecordingSink,
                                                       cli: dict[str, Any], slots: int) -> None:
    """`meshroute node` -> its TXT record -> a tracker's discovery, over loopback mDNS."""
    async with serve_app(_llamacpp()) as url, \
            tracker_discovery(sink, interfaces=LOOPBACK):
        if not cli.get("emulate"):
            cli = {"model": "m", "url": url + "/v1", **cli}
        settings = node_settings({"node_id": "n", "mdns_interfaces": LOOPBACK, **cli}, {})
        async with anyio.create_task_group() as tg:
            tg.start_soon(_serve, settings)
            if cli.get("emulate"):
                await sink.wait_for(lambda: "n" in sink.records, PATIENCE_S)
            else:  # after the server's pages were read: llama.cpp defers one request
                await sink.wait_for(lambda: "n" in sink.records and sink.records["n"].queue == 1,
                                    PATIENCE_S)
            announced = sink.records["n"]
            tg.cancel_scope.cancel()  # then its goodbye
    assert announced.slots == slots
