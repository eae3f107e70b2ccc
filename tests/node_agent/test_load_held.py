"""A node's engine load as its record's `held` (issue 31): the engine's running plus waiting
requests, every sender's, read from its pages and published within a quarter second of a
change, so that trackers count the requests others sent (core/node_load.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshroute_middleware.core import NodeRecord
from node_agent.announcer import HELD_MIN_INTERVAL_S, UPDATE_MIN_INTERVAL_S, NodeAnnouncer
from node_agent.engines import read_metrics
from node_agent.load import LoadReader

from .conftest import LOOPBACK
from .fakes import RecordingService

FIXTURES = Path(__file__).parent / "fixtures"
REAL = FIXTURES / "llamacpp_real"


@pytest.mark.parametrize(("source", "metrics", "slots", "held"), [
    ("llamacpp", "llamacpp_real/metrics_busy.txt", "llamacpp_real/slots_busy.json", 2),
    ("llamacpp", "llamacpp_real/metrics_fresh.txt", "llamacpp_real/slots_fresh.json", 0),
    ("llamacpp", None, "llamacpp_real/slots_busy.json", 2),  # /metrics off: busy slots
    ("vllm", "vllm_v1_metrics.txt", None, 5),  # 3 running + 2 waiting
    ("sglang", "sglang_metrics.txt", None, 162 + 2826),
])
def test_the_reader_counts_running_and_waiting(source: str, metrics: str | None,
                                               slots: str | None, held: int) -> None:
    reader = LoadReader("http://127.0.0.1:1/v1", source, 10.0)
    assert reader.held() is None  # nothing read: nothing claimed
    page = read_metrics((FIXTURES / metrics).read_text()) if metrics else None
    slots_page = json.loads((FIXTURES / slots).read_text()) if slots else None
    load = reader.take(page, slots_page)
    assert load is not None
    assert reader.held() == held


@pytest.mark.anyio
async def test_a_change_of_held_alone_goes_out_within_a_quarter_second() -> None:
    t = [0.0]
    announcer = NodeAnnouncer(NodeRecord("n", "m", 0, 31, 32, "http://127.0.0.1:9", 10.0),
                              interfaces=LOOPBACK, clock=lambda: t[0])
    service = RecordingService()
    announcer._service = service  # type: ignore[assignment]
    t[0] = 5.0
    assert await announcer.refresh(0, 10.0, held=2)
    assert service.sent[-1].properties[b"hd"] == b"2"
    t[0] += HELD_MIN_INTERVAL_S / 2
    assert not await announcer.refresh(0, 10.0, held=1)  # too soon even for the load
    t[0] += HELD_MIN_INTERVAL_S / 2
    assert await announcer.refresh(0, 10.0, held=1)  # a quarter second on: sent
    assert service.sent[-1].properties[b"hd"] == b"1"
    t[0] += HELD_MIN_INTERVAL_S
    assert await announcer.refresh(3, 10.0, held=5)  # the queue moves with it: the load
    assert service.sent[-1].properties[b"hd"] == b"5"
    t[0] += HELD_MIN_INTERVAL_S
    assert await announcer.refresh(3, 10.4, held=4)  # the speed re-measured within noise
    assert service.sent[-1].properties[b"hd"] == b"4"
    t[0] += HELD_MIN_INTERVAL_S
    assert not await announcer.refresh(3, 20.0, held=0)  # more than the load: once a second
    t[0] += UPDATE_MIN_INTERVAL_S
    assert await announcer.refresh(3, 20.0, held=0)
    assert not await announcer.refresh(3, 20.0)  # not given: the last count stays
    assert announcer.record.held == 0
