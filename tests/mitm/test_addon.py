"""The addon inside real mitmproxy, with the official openai client using it as its proxy."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mitmproxy")

import httpx
import openai

from meshroute_middleware.app.mitm.relay import RELAY_PATH
from meshroute_middleware.core import Router
from node_agent.emulator import EmulatedNode, EmulatorConfig
from tests.upstream import FakeChat

from .harness import Mitm, Node, dead_url, running_mitm

BASE = "http://mesh.invalid/v1"  # never resolved: the addon routes every chat request it knows
MESSAGES = [{"role": "user", "content": "hi"}]


def in_flight(router: Router, signature: str) -> int:
    """Attempts under way on one route, as the router's candidates report them."""
    model = signature.split("|", 1)[0]
    return sum(a.in_flight for a in router.arms(model) if a.route.signature == signature)


def emulated(node_id: str, start: int, end: int, **knobs: Any) -> Any:
    config = EmulatorConfig(node_id=node_id, model="m", start=start, end=end, layers=40,
                            **knobs)
    return EmulatedNode(config).app()


def client(mitm: Mitm, api_key: str = "sk-client-secret") -> openai.OpenAI:
    return openai.OpenAI(base_url=BASE, api_key=api_key, max_retries=0,
                         http_client=httpx.Client(proxy=mitm.proxy, timeout=20))


def table(mitm: Mitm) -> dict[str, dict[str, Any]]:
    doc = httpx.get(mitm.side + "/v1/routing", timeout=5).json()
    return {row["signature"]: row for row in doc["models"]["m"]["candidates"]}


@pytest.fixture
def mesh(tmp_path: Path) -> Iterator[Mitm]:
    """ADR-0020's mixed topology: a fast head for 0-21 and a slow node for all 40 layers."""
    nodes = [Node("gpu", 0, 21, tps=60, app=emulated("gpu", 0, 21, tps=400)),
             Node("cpu", 0, 39, tps=20, app=emulated("cpu", 0, 39, tps=200))]
    with running_mitm(tmp_path, nodes) as mitm:
        yield mitm


def test_openai_client_through_mitmproxy_stream_and_not(mesh: Mitm) -> None:
    chat = client(mesh)
    raw = chat.chat.completions.with_raw_response.create(
        model="m", messages=MESSAGES, max_tokens=12)
    completion = raw.parse()
    assert raw.headers["x-meshroute-route"] in {"m|cpu[0-39]", "m|gpu[0-21]->cpu[22-39]"}
    assert raw.headers["x-meshroute-mode"]
    assert completion.usage is not None and completion.usage.completion_tokens == 12
    stream = chat.chat.completions.create(model="m", messages=MESSAGES, max_tokens=10,
                                          stream=True)
    pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len([p for p in pieces if p]) == 10
    rows = table(mesh)
    measured = [r for r in rows.values() if r["samples"]]
    assert sum(r["samples"] for r in measured) == 2  # both requests became tps samples
    assert all(r["tps"] > 0 and r["ttfb_ms"] is not None for r in measured)
    with httpx.stream("GET", mesh.side + "/v1/routing/events", timeout=5) as resp:
        seen = b""
        for part in resp.iter_raw():
            seen += part
            if seen.count(b"event: outcome") >= 2:
                break
    assert seen.count(b"event: route-selected") >= 2
    metrics = httpx.get(mesh.side + "/metrics", timeout=5).text
    assert 'meshroute_outcomes_total{model="m",result="sample"} 2.0' in metrics
    assert httpx.get(mesh.side + "/dashboard", timeout=5).status_code == 200


def test_an_objective_is_read_from_the_header_and_the_field_never_reaches_the_head(
        tmp_path: Path) -> None:
    head = FakeChat("head", tokens=9)
    with running_mitm(tmp_path, [Node("head", app=head.app())]) as mitm:
        with httpx.Client(proxy=mitm.proxy, timeout=10) as http:
            sent = http.post(BASE + "/chat/completions", json={
                "model": "m", "messages": MESSAGES, "meshroute": {"objective": "ttft"}})
            bad = http.post(BASE + "/chat/completions", json={"model": "m", "messages": []},
                            headers={"x-meshroute-objective": "soon"})
        assert sent.status_code == 200, sent.text
        assert "meshroute" not in head.seen[-1]["body"]
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid_objective"
        assert len(head.seen) == 1


def test_the_head_gets_the_plan_and_no_client_credentials(tmp_path: Path) -> None:
    head = FakeChat("head", tokens=9)
    with running_mitm(tmp_path, [Node("head", app=head.app())]) as mitm:
        with httpx.Client(proxy=mitm.proxy, timeout=10) as http:
            resp = http.post(BASE + "/chat/completions", json={"model": "m", "messages": MESSAGES},
                             headers={"authorization": "Bearer sk-client-secret",
                                      "cookie": "session=1", "x-api-key": "k",
                                      "proxy-authorization": "Basic eDp5",
                                      "x-meshroute-route": "forged", "x-trace": "kept"})
        assert resp.status_code == 200, resp.text
        seen = head.seen[-1]["headers"]
        for name in ("authorization", "cookie", "x-api-key", "proxy-authorization"):
            assert name not in seen
        assert seen["x-trace"] == "kept"
        assert seen["x-meshroute-route"] == "m|head[0-39]"
        assert json.loads(seen["x-meshroute-plan"])[0]["node_id"] == "head"
        assert resp.headers["x-meshroute-route"] == "m|head[0-39]"


@pytest.mark.parametrize("stream", [False, True])
def test_a_refused_head_and_a_failing_head_fall_back_to_the_next_route(
        tmp_path: Path, stream: bool) -> None:
    # Best prior first (adr0021 with nothing proven is deterministic): the dead head, then the
    # one answering 500, then the live one; the client sees none of the failures.
    failing = FakeChat("failing", status=500)
    live = FakeChat("live", tokens=12)
    nodes = [Node("dead", tps=100, url=dead_url()), Node("failing", tps=50, app=failing.app()),
             Node("live", tps=10, app=live.app())]
    with running_mitm(tmp_path, nodes, meshroute_policy="adr0021",
                      meshroute_explore_share="0") as mitm:
        raw = client(mitm).chat.completions.with_raw_response.create(
            model="m", messages=MESSAGES, stream=stream)
        assert raw.headers["x-meshroute-route"] == "m|live[0-39]"
        assert raw.headers["x-meshroute-mode"] == "fallback"
        if stream:
            text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
            assert text.startswith("t0 t1 ")
        else:
            assert raw.parse().choices[0].message.content == "from live"
        rows = table(mitm)
        assert rows["m|dead[0-39]"]["failures"] == pytest.approx(1, abs=0.01)
        assert "connect" in rows["m|dead[0-39]"]["last_error"]
        assert rows["m|failing[0-39]"]["failures"] == pytest.approx(1, abs=0.01)
        assert rows["m|failing[0-39]"]["last_error"] == "http_5xx"
        assert rows["m|live[0-39]"]["samples"] == 1
        assert len(failing.seen) == 1


def test_every_route_failing_is_one_openai_error_listing_why(tmp_path: Path) -> None:
    nodes = [Node("dead", url=dead_url()), Node("busy", app=FakeChat("busy", status=503).app())]
    with running_mitm(tmp_path, nodes) as mitm:
        with pytest.raises(openai.InternalServerError) as info:
            client(mitm).chat.completions.create(model="m", messages=MESSAGES)
        assert info.value.status_code == 502  # issue 24: failed upstream (was 503)
        error = info.value.body
        assert isinstance(error, dict) and error["code"] == "upstream_failed"
        assert {r["route"] for r in error["routes"]} == {"m|dead[0-39]", "m|busy[0-39]"}


def test_every_route_rate_limited_is_a_429(tmp_path: Path) -> None:
    # issue 24: the 429 carries the soonest Retry-After any node's 429 said
    nodes = [Node(name, app=FakeChat(name, status=429, extra_headers={"Retry-After": after})
                  .app()) for name, after in (("a", "7"), ("b", "3"))]
    with running_mitm(tmp_path, nodes) as mitm:
        with pytest.raises(openai.RateLimitError) as info:
            client(mitm).chat.completions.create(model="m", messages=MESSAGES)
        assert isinstance(info.value.body, dict) and info.value.body["code"] == "rate_limited"
        assert info.value.response.headers["retry-after"] == "3"


def test_the_side_servers_lifespan_runs_health_checks(tmp_path: Path) -> None:
    # The gateway's background services run beside mitmproxy: a node that stops answering
    # leaves the topology (3 missed probes), as under `meshroute serve`.
    nodes = [Node("live", app=FakeChat("live").app()), Node("dead", url=dead_url())]
    with running_mitm(tmp_path, nodes, meshroute_health_interval_s="0.1") as mitm:
        deadline = time.monotonic() + 10
        while True:
            listed = {n["node_id"] for n in httpx.get(mitm.side + "/v1/nodes").json()["nodes"]}
            if listed == {"live"}:
                break
            assert time.monotonic() < deadline, f"dead node still listed: {listed}"
            time.sleep(0.05)


def test_stream_passes_chunk_by_chunk(tmp_path: Path) -> None:
    slow = FakeChat("slow", tokens=20, token_delay_s=0.05)
    with running_mitm(tmp_path, [Node("slow", app=slow.app())]) as mitm:
        arrivals = []
        with httpx.stream("POST", BASE + "/chat/completions", timeout=10,
                          json={"model": "m", "stream": True, "messages": MESSAGES},
                          proxy=mitm.proxy) as resp:
            start = time.perf_counter()
            for _ in resp.iter_raw():
                arrivals.append(time.perf_counter() - start)
        # 20 tokens 50 ms apart: a buffering proxy would deliver them all at once after ~1 s
        assert len(arrivals) >= 8
        assert arrivals[-1] - arrivals[0] > 0.5


def test_client_leaving_mid_stream_aborts_the_head_and_ends_the_attempt(
        tmp_path: Path) -> None:
    slow = FakeChat("slow", tokens=400, token_delay_s=0.02)
    with running_mitm(tmp_path, [Node("slow", app=slow.app())]) as mitm:
        with httpx.stream("POST", BASE + "/chat/completions", timeout=10,
                          json={"model": "m", "stream": True, "messages": MESSAGES},
                          proxy=mitm.proxy) as resp:
            for i, _ in enumerate(resp.iter_raw()):
                if i == 3:
                    break
        router = mitm.addon.router
        assert router is not None
        deadline = time.monotonic() + 10
        while slow.cancelled == 0 or in_flight(router, "m|slow[0-39]"):
            assert time.monotonic() < deadline, "the head kept streaming for a gone client"
            time.sleep(0.02)
        row = table(mitm)["m|slow[0-39]"]
        # what was delivered is recorded once (decayed on the real clock: not exactly 1)
        assert row["successes"] + row["failures"] == pytest.approx(1, abs=0.01)
        assert len(mitm.addon.relay) == 0


def test_non_chat_traffic_and_foreign_models_pass_untouched(tmp_path: Path) -> None:
    elsewhere = FakeChat("elsewhere", tokens=5)
    head = FakeChat("head")
    with running_mitm(tmp_path, [Node("head", app=head.app())],
                      extra_apps={"elsewhere": elsewhere.app()}) as mitm:
        target = mitm.extra["elsewhere"]
        with httpx.Client(proxy=mitm.proxy, timeout=10) as http:
            models = http.get(target + "/v1/models")
            foreign = http.post(target + "/v1/chat/completions",
                                json={"model": "gpt-other", "messages": MESSAGES},
                                headers={"authorization": "Bearer sk-for-elsewhere"})
        assert models.json()["data"][0]["id"] == "m" and "x-meshroute-route" not in models.headers
        assert foreign.json()["choices"][0]["message"]["content"] == "from elsewhere"
        assert elsewhere.seen[-1]["headers"]["authorization"] == "Bearer sk-for-elsewhere"
        assert "x-meshroute-route" not in foreign.headers and head.seen == []
        forged = httpx.post(mitm.side + RELAY_PATH, headers={"x-meshroute-ticket": "guess"})
        assert forged.status_code == 404 and forged.json()["error"]["code"] == "invalid_ticket"


@pytest.mark.parametrize(("body", "status", "code"), [
    (b"{not json", 400, "invalid_json"),
    (b'{"messages": []}', 400, "invalid_model"),
    (b'{"model": "m", "route": ["nobody"], "messages": []}', 400, "invalid_route"),
    (b'{"model": "zzz", "route": ["head"], "messages": []}', 404, "model_not_found"),
    (b'{"model": "m", "meshroute": {"objective": "fast"}, "messages": []}', 400,
     "invalid_objective"),
])
def test_bad_chat_requests_get_openai_errors(tmp_path: Path, body: bytes, status: int,
                                             code: str) -> None:
    with running_mitm(tmp_path, [Node("head", app=FakeChat("head").app())]) as mitm:
        resp = httpx.post(BASE + "/chat/completions", content=body, proxy=mitm.proxy,
                          headers={"content-type": "application/json"}, timeout=10)
        assert resp.status_code == status
        assert resp.json()["error"]["code"] == code
        assert resp.json()["error"]["type"]


def test_client_leaving_before_the_first_byte_cancels_the_head_request(
        tmp_path: Path) -> None:
    thinking = FakeChat("thinking", header_delay_s=10.0)
    with running_mitm(tmp_path, [Node("thinking", app=thinking.app())],
                      meshroute_first_byte_timeout_s="30") as mitm:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(BASE + "/chat/completions", proxy=mitm.proxy, timeout=0.5,
                       json={"model": "m", "messages": MESSAGES})
        router = mitm.addon.router
        assert router is not None
        deadline = time.monotonic() + 5  # far below the head's 10 s of thinking
        while thinking.cancelled == 0 or in_flight(router, "m|thinking[0-39]"):
            assert time.monotonic() < deadline, "the head kept working for a gone client"
            time.sleep(0.02)
        row = table(mitm)["m|thinking[0-39]"]
        assert row["failures"] == 0 and row["successes"] == 0  # says nothing of the route


class BrokenForwarder:
    """A bug in the forwarding seam: the addon must answer 500, not send the flow on."""

    async def open(self, url: str, body: bytes, headers: Any) -> Any:
        raise RuntimeError("a bug")

    async def aclose(self) -> None:
        pass


def test_a_bug_of_ours_is_a_json_500_and_leaves_nothing_in_flight(tmp_path: Path) -> None:
    with running_mitm(tmp_path, [Node("head", app=FakeChat("head").app())],
                      forwarder=BrokenForwarder()) as mitm:
        resp = httpx.post(BASE + "/chat/completions", proxy=mitm.proxy, timeout=10,
                          json={"model": "m", "messages": MESSAGES})
        assert resp.status_code == 500 and resp.json()["error"]["code"] == "internal_error"
        assert mitm.addon.router is not None
        assert in_flight(mitm.addon.router, "m|head[0-39]") == 0
        assert mitm.addon.telemetry is not None and mitm.addon.telemetry.in_flight == 0


def test_a_vision_request_goes_to_the_route_that_sees(tmp_path: Path) -> None:
    """Issue 25 in the addon too: capabilities filter its routes as the gateway's."""
    plain, eyes = FakeChat("plain", tokens=3), FakeChat("eyes", tokens=3)
    nodes = [Node("plain", tps=500, app=plain.app(), caps=[]),
             Node("eyes", tps=1, app=eyes.app(), caps=["vision"])]
    image = [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]
    with running_mitm(tmp_path, nodes) as mitm:
        for _ in range(3):
            raw = client(mitm).chat.completions.with_raw_response.create(
                model="m", messages=image)  # type: ignore[arg-type]
            assert raw.headers["x-meshroute-route"] == "m|eyes[0-39]"
        assert plain.seen == []
        with pytest.raises(openai.BadRequestError) as info:
            client(mitm).chat.completions.create(
                model="m", messages=MESSAGES, response_format={  # type: ignore[arg-type]
                    "type": "json_schema", "json_schema": {"name": "x", "schema": {}}})
        assert info.value.code == "unsupported_capability"
