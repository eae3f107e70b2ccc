"""A stream the gateway cuts as it stops (the drain's cut, or its forwarder closed under the
answer) is our doing, not the route's: the attempt ends with no sample and no failure of the
route, and leaves nothing in flight."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
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
from .test_forwarder_closed import _gateway as closed_gateway


def _learned(gateway: Any, path: str) -> tuple[float, float, float, int]:
    """(successes, failures, samples, in flight) of the mesh route; (successes, failures,
    routes with a learned tokens/s, 0) over the provider routes."""
    if path == "mesh":
        (row,) = gateway.router.routing_table("m")["models"]["m"]["candidates"]
        return row["successes"], row["failures"], row["samples"], row["in_flight"]
    stats = gateway.providers.stats.values()
    return (sum(st.ok for st in stats), sum(st.fail for st in stats),
            sum(st.tokens_per_s is not None for st in stats), 0)


@contextmanager
def _gateway(path: str) -> Iterator[tuple[Any, str]]:
    """A gateway whose answer streams and then holds (mesh: a node; provider: a provider
    chain's 20 s answer, tests/app/test_forwarder_closed.py); it and the model to ask."""
    if path == "provider":
        with closed_gateway("provider") as (gateway, model):
            yield gateway, model
        return
    head = FakeChat("held", tokens=20, hold_after=3)  # held mid-stream until released
    try:
        with ServerThread(head.app()) as up:
            gateway = build_gateway(replace(ServeSettings(), mdns=False, seed=3,
                                            router=RouterConfig(explore_share=0.0)))
            gateway.mesh.upsert(parse_node({"node_id": "held", "model": "m", "start": 0,
                                            "end": 0, "layers": 1, "url": up.url, "tps": 10}))
            yield gateway, "m"
    finally:
        head.released.set()


@pytest.mark.parametrize("path", ["mesh", "provider"])
@pytest.mark.parametrize("cut", ["drain", "forwarder"])
def test_a_stream_cut_at_shutdown_is_no_sample_of_its_route(cut: str, path: str) -> None:
    lines: list[str] = []
    streaming = threading.Event()
    with _gateway(path) as (gateway, model):
        drain = Drain(gateway.app, gateway.telemetry.events)
        app = LoopOf(drain)

        def read() -> None:
            try:
                with httpx.stream("POST", f"{server.url}/v1/chat/completions",
                                  timeout=PATIENCE_S, json={
                                      "model": model, "stream": True,
                                      "messages": [{"role": "user", "content": "hi"}]}) as r:
                    for line in r.iter_lines():
                        lines.append(line)
                        if '"content"' in line:
                            streaming.set()
            except httpx.HTTPError as exc:
                lines.append(f"transport: {exc!r}")
            finally:
                streaming.set()

        with ServerThread(app) as server:
            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            assert streaming.wait(PATIENCE_S), lines
            assert app.loop is not None and gateway.forwarder is not None
            if path == "mesh":
                assert _learned(gateway, path)[3] == 1  # in flight
            if cut == "drain":
                app.loop.call_soon_threadsafe(drain.drain)
            else:
                asyncio.run_coroutine_threadsafe(gateway.forwarder.aclose(),
                                                 app.loop).result(PATIENCE_S)
            reader.join(PATIENCE_S)
            assert not reader.is_alive()
            learned = _learned(gateway, path)  # settled before the client's stream ended
    data = [line for line in lines if line.startswith("data: ")]
    assert '"shutting_down"' in data[-1], lines[-3:]  # cut short, as a drain cuts
    assert learned == (0, 0, 0, 0), learned
