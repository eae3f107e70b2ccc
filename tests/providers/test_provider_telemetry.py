"""Provider attempts tell the world as mesh attempts do: `route-selected` and `outcome` events
on /v1/routing/events, Prometheus counters and key states on /metrics; /v1/models lists the
chains and provider models beside the mesh models."""

from __future__ import annotations

import json
from typing import Any

import httpx

from ..conftest import FakeClock
from .fake_provider import FakeProvider, Reply
from .gateway import ENV, Running, gateway, providers_doc

T0 = 1_796_040_000.0


def _events_over_http(gw: Running, wanted: int) -> list[dict[str, Any]]:
    """The first `wanted` events of /v1/routing/events (the history, then live)."""
    events: list[dict[str, Any]] = []
    with httpx.stream("GET", f"{gw.url}/v1/routing/events", timeout=10) as resp:
        assert resp.status_code == 200
        for line in resp.iter_lines():
            if line.startswith("data: "):
                events.append(json.loads(line[6:]))
                if len(events) == wanted:
                    break
    return events


def test_a_429_then_a_fallback_are_events_metrics_and_key_states(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.by_key[ENV["FAST_A"]] = Reply.rate_limited("20")
    clock = FakeClock(T0)
    with gateway(providers_doc(fast, slow), clock=clock) as gw:
        answer = gw.chat("auto", route=["fastco/big-model"], max_tokens=8)
        assert answer.status_code == 200
        assert answer.headers["x-meshroute-tried"] == "fastco/big-model#1,fastco/big-model#2"
        events = _events_over_http(gw, 4)
        metrics = httpx.get(f"{gw.url}/metrics").text

    assert [(e["type"], e["signature"]) for e in events] == [
        ("route-selected", "fastco/big-model#1"), ("outcome", "fastco/big-model#1"),
        ("route-selected", "fastco/big-model#2"), ("outcome", "fastco/big-model#2")]
    for e in events:
        assert e["mode"] == "provider" and e["model"] == "fastco/big-model"
        assert e["head"] == "fastco" and e["chain"] == "auto"
    assert [e["attempt"] for e in events] == [0, 0, 1, 1]
    limited, served = events[1], events[3]
    assert limited["ok"] is False and limited["result"] == "failure"
    assert limited["error"] == "http_429" and limited["cooldown_until"] == T0 + 20
    assert served["ok"] is True and served["error"] is None
    assert served["result"] == "sample" and served["completion_tokens"] == 8
    assert served["tps"] > 0 and 0 <= served["ttfb_ms"] <= served["seconds"] * 1000
    assert "cooldown_until" not in served

    assert ('meshroute_decisions_total{mode="provider",model="fastco/big-model"} 2.0'
            in metrics)
    assert 'meshroute_outcomes_total{model="fastco/big-model",result="failure"} 1.0' in metrics
    assert 'meshroute_outcomes_total{model="fastco/big-model",result="sample"} 1.0' in metrics
    assert 'meshroute_forward_errors_total{kind="http_429"} 1.0' in metrics
    assert ('meshroute_provider_key_state{key="1",route="fastco/big-model",state="cooldown"} '
            '1.0' in metrics)
    assert ('meshroute_provider_key_state{key="2",route="fastco/big-model",state="ready"} 1.0'
            in metrics)
    assert 'meshroute_provider_key_wait_seconds{key="1",route="fastco/big-model"} 20.0' in metrics
    for secret in ENV.values():
        assert secret not in metrics and secret not in json.dumps(events)


def test_an_upstream_failure_and_a_client_error_are_outcomes_of_their_own(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.default = Reply.error(503)
    with gateway(providers_doc(fast, slow)) as gw:
        assert gw.chat("auto").status_code == 200  # fastco 503s, slowco serves
        slow.default = Reply.error(400)
        assert gw.chat("slowco/small-model").status_code == 400  # relayed, blames nobody
        history = gw.gateway.telemetry.events.history()
    outcomes = [(e["signature"], e["result"], e["error"]) for e in history
                if e["type"] == "outcome"]
    assert outcomes[0] == ("fastco/big-model#1", "failure", "http_5xx")
    assert outcomes[-2][:2] == ("slowco/small-model#1", "sample")
    assert outcomes[-1] == ("slowco/small-model#1", "client_error", "client_error")
    assert gw.gateway.telemetry.forward_errors == {"http_5xx": 1}


def test_models_lists_the_chains_and_provider_models_beside_the_mesh_models(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    doc = providers_doc(fast, slow, routing={"strategy": "fastest"})
    doc["profiles"] = {"budget": {"chain": ["slowco/small-model"], "strategy": "cheapest"}}
    with gateway(doc) as gw:
        httpx.post(f"{gw.url}/v1/nodes", json={
            "node_id": "n1", "model": "qwen-demo", "start": 0, "end": 39, "layers": 40,
            "url": "http://127.0.0.1:9", "tps": 50}).raise_for_status()
        listing = httpx.get(f"{gw.url}/v1/models").json()
    assert listing["object"] == "list"
    rows = {m["id"]: m for m in listing["data"]}
    assert list(rows) == ["qwen-demo", "auto", "auto:budget", "fastco/big-model",
                          "slowco/small-model"]
    assert all(m["object"] == "model" for m in listing["data"])
    assert rows["qwen-demo"]["kind"] == "mesh" and rows["qwen-demo"]["nodes"] == 1
    assert rows["auto"] == {"id": "auto", "object": "model", "owned_by": "meshroute",
                            "kind": "chain", "strategy": "fastest",
                            "chain": ["fastco/big-model", "slowco/small-model"]}
    assert rows["auto:budget"]["chain"] == ["slowco/small-model"]
    assert rows["auto:budget"]["strategy"] == "cheapest"
    assert rows["fastco/big-model"] == {"id": "fastco/big-model", "object": "model",
                                        "owned_by": "fastco", "kind": "provider",
                                        "tier": "large", "context": 4096,
                                        "capabilities": ["tools", "json_schema"]}
