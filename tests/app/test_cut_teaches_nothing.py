"""A stream the gateway cuts as it stops (the drain's cut, or its forwarder closed under the
answer) is our doing, not the route's: the attempt ends with no sample and no failure of the
route, and leaves nothing in flight."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import replace
from typing import Any

import httpx
import pytest

from meshroute_middleware.app.drain import Drain
from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig, parse_node

from ..upstream import FakeChat, ServerThread
from .test_forwarder_closed import PATIENCE_S, LoopOf


def _route_row(gateway: Any) -> dict[str, Any]:
    (row,) = gateway.router.routing_table("m")["models"]["m"]["candidates"]
    return dict(row)


@pytest.mark.parametrize("cut", ["drain", "forwarder"])
def test_a_stream_cut_at_shutdown_is_no_sample_of_its_route(cut: str) -> None:
    head = FakeChat("held", tokens=20, hold_after=3)  # held mid-stream until released
    with ServerThread(head.app()) as up:
        gateway = build_gateway(replace(ServeSettings(), mdns=False, seed=3,
                                        router=RouterConfig(explore_share=0.0)))
        gateway.mesh.upsert(parse_node({"node_id": "held", "model": "m", "start": 0, "end": 0,
                                        "layers": 1, "url": up.url, "tps": 10}))
        drain = Drain(gateway.app, gateway.telemetry.events)
        app = LoopOf(drain)
        lines: list[str] = []
        streaming = threading.Event()

        def read() -> None:
            try:
                with httpx.stream("POST", f"{server.url}/v1/chat/completions",
                                  timeout=PATIENCE_S, json={
                                      "model": "m", "stream": True,
                                      "messages": [{"role": "user", "content": "hi"}]}) as r:
                    for line in r.iter_lines():
                        lines.append(line)
                        if '"t2 "' in line:
                            streaming.set()
            except httpx.HTTPError as exc:
                lines.append(f"transport: {exc!r}")
            finally:
                streaming.set()

        try:
            with ServerThread(app) as server:
                reader = threading.Thread(target=read, daemon=True)
                reader.start()
                assert streaming.wait(PATIENCE_S), lines
                assert app.loop is not None and gateway.forwarder is not None
                assert _route_row(gateway)["in_flight"] == 1
                if cut == "drain":
                    app.loop.call_soon_threadsafe(drain.drain)
                else:
                    asyncio.run_coroutine_threadsafe(gateway.forwarder.aclose(),
                                                     app.loop).result(PATIENCE_S)
                reader.join(PATIENCE_S)
                assert not reader.is_alive()
                row = _route_row(gateway)  # settled before the client's stream ended
        finally:
            head.released.set()
    data = [line for line in lines if line.startswith("data: ")]
    assert '"shutting_down"' in data[-1], lines[-3:]  # cut short, as a drain cuts
    assert (row["successes"], row["failures"], row["samples"], row["in_flight"]) \
        == (0, 0, 0, 0), row
