"""The engine's load travels to trackers (issue 31): requests another sender put on an
engine, read from its /slots by `meshroute node`, reach a tracker's discovery over loopback
mDNS as the record's `held`. How long that takes is printed (the staleness of a tracker's
view; docs/architecture.md, "One node, several trackers"), not asserted."""

from __future__ import annotations

import json
import time

import anyio
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from node_agent.cli import _serve, node_settings
from node_agent.discovery import tracker_discovery
from node_agent.serving import serve_app

from .conftest import LOOPBACK, PATIENCE_S, RecordingSink

SLOTS = 4


class Engine:
    """A llama.cpp-shaped server whose busy slots the test sets (no /metrics: the agent
    counts /slots' busy ones)."""

    def __init__(self) -> None:
        self.busy = 0
        self.changed_at = time.monotonic()

    def set_busy(self, busy: int) -> None:
        self.busy, self.changed_at = busy, time.monotonic()

    def app(self) -> Starlette:
        async def slots(request: Request) -> Response:
            return PlainTextResponse(json.dumps(
                [{"id": i, "n_ctx": 4096, "is_processing": i < self.busy}
                 for i in range(SLOTS)]))

        async def props(request: Request) -> Response:
            return PlainTextResponse(json.dumps({"total_slots": SLOTS}))

        async def models(request: Request) -> Response:
            return PlainTextResponse('{"object": "list", "data": []}')

        return Starlette(routes=[Route("/slots", slots), Route("/props", props),
                                 Route("/v1/models", models), Route("/v1/v1/models", models)])


@pytest.mark.anyio
async def test_requests_others_sent_reach_the_tracker_as_held(sink: RecordingSink) -> None:
    engine = Engine()
    async with serve_app(engine.app()) as url, \
            tracker_discovery(sink, interfaces=LOOPBACK):
        settings = node_settings({"node_id": "n", "mdns_interfaces": LOOPBACK, "model": "m",
                                  "url": url + "/v1", "load_from": "llamacpp"}, {})
        async with anyio.create_task_group() as tg:
            tg.start_soon(_serve, settings)
            await sink.wait_for(lambda: "n" in sink.records
                                and sink.records["n"].held == 0, PATIENCE_S)
            staleness = []
            for busy in (3, 1, 4, 0, 3):
                await anyio.sleep(1.1)  # past the announcer's once-a-second limit
                engine.set_busy(busy)
                # a count seen before comes again (0, 3): mDNS must still deliver it
                await sink.wait_for(lambda b=busy: sink.records["n"].held == b,  # type: ignore[misc]
                                    PATIENCE_S)
                staleness.append(time.monotonic() - engine.changed_at)
            tg.cancel_scope.cancel()
    print(f"engine change -> tracker's record: {', '.join(f'{s:.2f}' for s in staleness)} s")
