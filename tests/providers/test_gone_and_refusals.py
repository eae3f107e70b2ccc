"""What a client is told when a model's nodes are gone, when it must wait, and when an answer
cannot be read (issue 33, item 11): 503 `no_route_available` (not 404) for a model whose
last node left or that has a `[mesh.MODEL]` table; refusals name a clock time to retry at
(`Retry-After` stays in seconds); a provider body that cannot be read is `upstream_invalid`."""

from __future__ import annotations

import calendar

import httpx
import pytest

from meshroute_middleware.core import Router, UnknownModelError, parse_node
from meshroute_middleware.core.contracts.retry_text import retry_text, span_text
from meshroute_middleware.core.errors import ModelGoneError
from meshroute_middleware.core.providers.chain import Resolution, provider_candidate
from meshroute_middleware.core.providers.config import parse_providers_config
from meshroute_middleware.core.providers.exhaustion import PassedOver, exhaustion
from meshroute_middleware.core.topology import MAX_DEPARTED, Topology

from ..chat.test_mesh_retry_after import forward_429
from ..conftest import FakeClock
from ..upstream import FakeChat, ServerThread
from .fake_provider import FakeProvider, Reply
from .gateway import gateway, providers_doc
from .test_client_spend import MIDNIGHT, T0, make_client, priced_doc, served


def node(node_id: str, model: str = "qwen") -> dict[str, object]:
    return {"node_id": node_id, "model": model, "start": 0, "end": 0, "layers": 1,
            "url": "http://127.0.0.1:9", "tps": 10}


@pytest.mark.parametrize(("seconds", "text"), [
    (0.2, "1 s"), (59, "59 s"), (60, "1 min"), (185, "3 min 5 s"), (3600, "1 h"),
    (31722, "8 h 49 min"), (86400, "1 d"), (2 * 86400 + 3 * 3600, "2 d 3 h")])
def test_span_text(seconds: float, text: str) -> None:
    assert span_text(seconds) == text


def test_retry_text_is_a_utc_time_and_how_long() -> None:
    until = calendar.timegm((2026, 12, 5, 0, 0, 0))
    assert retry_text(until, until - 31722) == ("retry after 2026-12-05T00:00:00Z "
                                                "(8 h 49 min)")


def test_the_topology_remembers_a_departed_model_until_a_node_joins_it() -> None:
    topo = Topology()
    topo.upsert(parse_node(node("a")), 1.0)
    topo.upsert(parse_node(node("b")), 1.0)
    topo.remove("a", 2.0)
    assert topo.departed("qwen") is None  # b still serves it
    topo.remove("b", 3.0)
    assert topo.departed("qwen") == 3.0 and topo.model("qwen") is None
    topo.upsert(parse_node(node("a")), 4.0)
    assert topo.departed("qwen") is None
    for i in range(MAX_DEPARTED + 1):  # bounded: the oldest names are forgotten first
        topo.upsert(parse_node(node(f"n{i}", f"m{i}")), 5.0)
        topo.remove(f"n{i}", 6.0)
    assert topo.departed("m0") is None and topo.departed(f"m{MAX_DEPARTED}") == 6.0


def test_choose_tells_a_departed_model_from_an_unknown_one(clock: FakeClock) -> None:
    router = Router(clock=clock)
    router.upsert_node(parse_node(node("a")))
    router.remove_node("a")
    with pytest.raises(ModelGoneError, match="its last node left"):
        router.choose("qwen")
    with pytest.raises(UnknownModelError) as unknown:
        router.choose("never-seen")
    assert not isinstance(unknown.value, ModelGoneError)


def test_a_model_whose_only_node_left_answers_503(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    doc = providers_doc(fast, slow, mesh={"declared": {}})
    with ServerThread(FakeChat("n1", tokens=2).app()) as head, gateway(doc) as gw:
        httpx.post(f"{gw.url}/v1/nodes", json={**node("n1"), "url": head.url})
        served_first = gw.chat("qwen")
        assert httpx.delete(f"{gw.url}/v1/nodes/n1").status_code == 200
        gone = gw.chat("qwen")
        declared = gw.chat("declared")
        unknown = gw.chat("never-seen")
    assert served_first.status_code == 200
    assert gone.status_code == 503
    error = gone.json()["error"]
    assert error["code"] == "no_route_available" and error["type"] == "server_error"
    assert error["message"] == ("no node serves model 'qwen' now: its last node left (it is "
                                "routed again as soon as a node serves it)")
    assert declared.status_code == 503
    assert "declared mesh model ([mesh.declared])" in declared.json()["error"]["message"]
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"


def test_a_budget_refusal_says_when_to_retry_as_a_time(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.default = Reply.ok(tokens=8, prompt_tokens=5)
    with served(priced_doc(fast, slow), [make_client("alice", daily_tokens=30)],
                FakeClock(T0)) as gw:
        for _ in range(2):
            gw.chat("alice", max_tokens=1)
        refused = gw.chat("alice", max_tokens=1)
    assert refused.status_code == 429
    assert refused.headers["retry-after"] == str(int(MIDNIGHT - T0))  # seconds, as HTTP says
    assert refused.json()["error"]["message"].endswith(
        f"; retry after 2026-12-01T00:00:00Z ({span_text(MIDNIGHT - T0)})")
    assert span_text(MIDNIGHT - T0) == "12 h"


def test_an_exhausted_chain_says_when_a_route_frees() -> None:
    cfg = parse_providers_config({"providers": [{
        "name": "fastco", "base_url": "http://127.0.0.1:9/v1", "keys": ["env:FAST_A"],
        "models": [{"id": "big-model", "tier": "large"}]}]})
    pair = cfg.split_route("fastco/big-model")
    assert pair is not None
    res = Resolution("auto", "balanced", (provider_candidate(*pair),))
    now = calendar.timegm((2026, 12, 4, 23, 58, 30))
    told = exhaustion(res, [PassedOver("fastco/big-model#1", "rpm", now + 90)], now)
    assert told.status == 429 and told.retry_after_s == 90
    assert told.message.endswith("; retry after 2026-12-05T00:00:00Z (1 min 30 s)")


def test_a_provider_answer_that_cannot_be_read_is_upstream_invalid(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.default = Reply(encoding="deflate")  # labelled deflate, sent plain: undecodable
    with gateway(providers_doc(fast, slow, chain=("fastco/big-model",))) as gw:
        answer = gw.chat("auto")
    assert answer.status_code == 502
    assert {r["reason"] for r in answer.json()["error"]["routes"]} == {"upstream_invalid"}


@pytest.mark.anyio
async def test_the_mesh_paths_429_says_when_to_retry_as_a_time() -> None:
    resp = await forward_429("90", "600")
    message = resp.json()["error"]["message"]
    assert resp.headers["retry-after"] == "90"
    assert message.endswith(" (1 min 30 s)") and "; retry after 20" in message, message
