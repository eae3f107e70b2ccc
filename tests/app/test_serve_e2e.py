"""The real thing: uvicorn on loopback ports, aiohttp forwarding, the official openai client."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import httpx
import openai
import pytest

from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig

from ..conftest import FakeClock
from ..upstream import FakeChat, ServerThread, free_port


def start_gateway(clock: Callable[[], float] = time.time,
                  **settings: Any) -> tuple[ServerThread, Any]:
    base = ServeSettings(mdns=False, seed=3, router=RouterConfig(explore_share=0.0),
                         first_byte_timeout_s=1.0, connect_timeout_s=1.0)
    gateway = build_gateway(replace(base, **settings), clock=clock)
    return ServerThread(gateway.app), gateway


def register(gw_url: str, node_id: str, url: str, start: int = 0, end: int = 39,
             tps: float = 10.0) -> None:
    resp = httpx.post(f"{gw_url}/v1/nodes", json={
        "node_id": node_id, "model": "m", "start": start, "end": end, "layers": 40,
        "url": url, "tps": tps})
    assert resp.status_code in (200, 201), resp.text


def in_flight(gw_url: str) -> int:
    """Attempts under way over every route, as /v1/routing reports them."""
    table = httpx.get(gw_url + "/v1/routing").json()
    return sum(row["in_flight"] for model in table["models"].values()
               for row in model["candidates"])


@pytest.fixture
def mesh() -> Iterator[dict[str, Any]]:
    gpu, cpu = FakeChat("gpu", tokens=24), FakeChat("cpu", tokens=24, token_delay_s=0.002)
    with ServerThread(gpu.app()) as g, ServerThread(cpu.app()) as c:
        server, gateway = start_gateway()
        with server:
            register(server.url, "gpu", g.url, 0, 21, tps=30)
            register(server.url, "cpu", c.url, 0, 39, tps=8)
            yield {"url": server.url, "gateway": gateway, "gpu": gpu, "cpu": cpu}


def test_openai_client_non_stream_and_stream(mesh: dict[str, Any]) -> None:
    client = openai.OpenAI(base_url=mesh["url"] + "/v1", api_key="unused", max_retries=0)
    raw = client.chat.completions.with_raw_response.create(  # as sent, not gathered from a
        model="m", messages=[{"role": "user", "content": "hi"}],  # stream (chat/gather.py)
        extra_body={"meshroute": {"continue": False}})
    completion = raw.parse()
    route = raw.headers["x-meshroute-route"]
    assert route in {"m|cpu[0-39]", "m|gpu[0-21]->cpu[22-39]"}
    assert completion.usage is not None and completion.usage.completion_tokens == 24
    head = mesh["gpu"] if route.startswith("m|gpu") else mesh["cpu"]
    plan = json.loads(head.seen[-1]["headers"]["x-meshroute-plan"])
    assert "|" + "->".join(f"{h['node_id']}[{h['start_layer']}-{h['end_layer']}]"
                           for h in plan) == route[1:]
    if route.startswith("m|gpu"):
        assert plan[1]["start_layer"] == 22  # ADR-0020's flaw, fixed structurally
    stream = client.chat.completions.create(
        model="m", messages=[{"role": "user", "content": "hi"}], stream=True)
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert text.startswith("t0 t1 ")
    table = httpx.get(mesh["url"] + "/v1/routing").json()["models"]["m"]
    measured = [r for r in table["candidates"] if r["samples"]]
    assert sum(r["samples"] for r in measured) == 2
    assert all(r["tps"] > 0 and r["status"] == "proven" for r in measured)


def test_stream_is_relayed_chunk_by_chunk(mesh: dict[str, Any]) -> None:
    mesh["cpu"].token_delay_s = 0.05
    mesh["gpu"].token_delay_s = 0.05
    arrivals = []
    with httpx.stream("POST", mesh["url"] + "/v1/chat/completions", json={
            "model": "m", "stream": True, "messages": []}, timeout=10) as resp:
        start = time.perf_counter()
        for _ in resp.iter_raw():
            arrivals.append(time.perf_counter() - start)
    # 24 tokens at least 50 ms apart: a buffering relay would deliver everything at once, a
    # relay passes them on spread over at least ~1.2 s (a busy machine only spreads them more).
    assert len(arrivals) >= 10
    assert arrivals[-1] - arrivals[0] > 0.8


def test_client_disconnect_cancels_upstream(mesh: dict[str, Any]) -> None:
    for head in (mesh["cpu"], mesh["gpu"]):
        head.token_delay_s, head.tokens = 0.05, 200
    with httpx.stream("POST", mesh["url"] + "/v1/chat/completions", json={
            "model": "m", "stream": True, "messages": []}, timeout=10) as resp:
        for i, _ in enumerate(resp.iter_raw()):
            if i == 3:
                break
    deadline = time.monotonic() + 5
    while mesh["cpu"].cancelled + mesh["gpu"].cancelled == 0:
        assert time.monotonic() < deadline, "upstream kept streaming after the client left"
        time.sleep(0.02)
    deadline = time.monotonic() + 5
    while in_flight(mesh["url"]):
        assert time.monotonic() < deadline, "the cancelled attempt stayed in flight"
        time.sleep(0.02)


def test_client_leaving_before_the_first_byte_cancels_the_upstream_request() -> None:
    slow = FakeChat("slow", header_delay_s=5.0)
    with ServerThread(slow.app()) as up:
        server, _gateway = start_gateway(first_byte_timeout_s=30.0)
        with server:
            register(server.url, "slow", up.url)
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(server.url + "/v1/chat/completions",
                           json={"model": "m", "messages": []}, timeout=0.5)
            deadline = time.monotonic() + 3
            while slow.cancelled == 0:
                assert time.monotonic() < deadline, "the head kept working for a gone client"
                time.sleep(0.02)
            assert in_flight(server.url) == 0
            row = httpx.get(server.url + "/v1/routing").json()["models"]["m"]["candidates"][0]
            assert row["failures"] == 0 and row["samples"] == 0  # says nothing of the route


def test_dead_and_slow_heads_fall_back_over_real_sockets() -> None:
    good = FakeChat("good", tokens=10)
    stall = FakeChat("stall", header_delay_s=3.0)
    with ServerThread(good.app()) as g, ServerThread(stall.app()) as s:
        server, gateway = start_gateway()
        with server:
            register(server.url, "dead", f"http://127.0.0.1:{free_port()}", tps=100)
            register(server.url, "stall", s.url, tps=50)
            register(server.url, "good", g.url, tps=10)
            resp = httpx.post(server.url + "/v1/chat/completions",
                              json={"model": "m", "messages": []}, timeout=10)
            assert resp.status_code == 200
            assert resp.headers["x-meshroute-route"] == "m|good[0-39]"
            errors = {e["head"]: e["error"] for e in gateway.telemetry.events.history()
                      if e["type"] == "outcome"}
            assert errors == {"dead": "connect", "stall": "timeout", "good": None}


def test_head_dying_mid_stream_over_real_sockets() -> None:
    dying = FakeChat("dying", tokens=20, die_after=5, token_delay_s=0.01)
    with ServerThread(dying.app()) as d:
        server, _gateway = start_gateway(clock=FakeClock())  # the failure does not decay
        with server:
            register(server.url, "dying", d.url)
            resp = httpx.post(server.url + "/v1/chat/completions",
                              json={"model": "m", "stream": True, "messages": []}, timeout=10)
            events = [e for e in resp.text.split("\n\n") if e.strip()]
            assert json.loads(events[-1].removeprefix("data: "))["error"]["code"] == (
                "upstream_failed")
            row = httpx.get(server.url + "/v1/routing").json()["models"]["m"]["candidates"][0]
            assert row["last_error"] == "stream" and row["failures"] == 1.0


def test_event_stream_delivers_history_and_live_events(mesh: dict[str, Any]) -> None:
    httpx.post(mesh["url"] + "/v1/chat/completions", json={"model": "m", "messages": []})
    got: list[dict[str, Any]] = []
    subscribed = threading.Event()  # the history arrived: live events will follow

    def listen() -> None:
        with httpx.stream("GET", mesh["url"] + "/v1/routing/events", timeout=10) as resp:
            assert resp.headers["content-type"].startswith("text/event-stream")
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    got.append(json.loads(line[6:]))
                    if got[-1]["type"] == "outcome":
                        subscribed.set()
                if [e["type"] for e in got].count("outcome") >= 2:
                    return

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    assert subscribed.wait(10), "the history never arrived"
    httpx.post(mesh["url"] + "/v1/chat/completions", json={"model": "m", "messages": []})
    listener.join(10)
    kinds = [e["type"] for e in got]
    assert kinds.count("route-selected") >= 2 and kinds.count("outcome") >= 2
    selected = [e for e in got if e["type"] == "route-selected"]
    assert all({"mode", "signature"} <= set(e) for e in selected)


def test_nodes_registered_over_http_are_health_checked_without_mdns() -> None:
    head = FakeChat("h")
    port = free_port()
    server, gateway = start_gateway(health_interval_s=0.2)
    with server:
        with ServerThread(head.app(), port=port) as up:
            register(server.url, "h", up.url)
            assert [n["node_id"] for n in httpx.get(server.url + "/v1/nodes").json()["nodes"]]
        deadline = time.monotonic() + 5  # the head is gone: 3 missed probes remove it
        while httpx.get(server.url + "/v1/nodes").json()["nodes"]:
            assert time.monotonic() < deadline, "a dead node stayed in the topology"
            time.sleep(0.05)
        with ServerThread(head.app(), port=port):  # it answers again: it comes back
            deadline = time.monotonic() + 5
            while not httpx.get(server.url + "/v1/nodes").json()["nodes"]:
                assert time.monotonic() < deadline, "a node that answers again stayed out"
                time.sleep(0.05)
    assert gateway.router.models() == ["m"]
