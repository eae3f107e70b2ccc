"""Mesh models inside a chain, auto:* ordering after warm-up, and the admin token."""

from __future__ import annotations

from typing import Any

import httpx

from ..upstream import FakeChat, ServerThread
from .fake_provider import FakeProvider, Reply
from .gateway import gateway, providers_doc


def test_a_mesh_chain_fails_over_to_a_provider_and_back(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    node = FakeChat("n1", tokens=12)
    doc = providers_doc(fast, slow, chain=("qwen", "slowco/small-model"),
                        mesh={"qwen": {"tier": "large"}})
    with ServerThread(node.app()) as head, gateway(doc) as gw:
        joined = httpx.post(f"{gw.url}/v1/nodes", json={
            "node_id": "n1", "model": "qwen", "start": 0, "end": 39, "layers": 40,
            "url": head.url, "tps": 10})
        assert joined.status_code in (200, 201)
        mesh = gw.chat("auto", route=["qwen"])
        assert mesh.status_code == 200
        assert mesh.headers["x-meshroute-route"] == "qwen|n1[0-39]"
        assert mesh.headers["x-meshroute-tried"] == "qwen"
        assert node.seen[-1]["body"]["model"] == "qwen"  # the head gets its own model name
        assert "authorization" not in node.seen[-1]["headers"]
        node.status = 500
        over = gw.chat("auto", route=["qwen"])
        assert over.status_code == 200
        assert over.headers["x-meshroute-tried"] == "qwen,slowco/small-model#1"
        assert over.headers["x-meshroute-route"] == "slowco/small-model#1"
        node.status = 200
        back = gw.chat("auto", route=["qwen"])
        assert back.headers["x-meshroute-route"] == "qwen|n1[0-39]"
        chain = httpx.get(f"{gw.url}/v1/routing/chain", params={"model": "auto"}).json()
        qwen = next(r for r in chain["chain"] if r["route"] == "qwen")
        assert qwen["price"] == 1.0 and qwen["intelligence"] == 0.75 and qwen["keys"] == []
        assert 0 < qwen["reliability"] < 1  # one failure, two successes, on the same axes
        mesh_table = httpx.get(f"{gw.url}/v1/routing", params={"model": "qwen"}).json()
    rows = mesh_table["models"]["qwen"]["candidates"]
    assert sum(r["samples"] for r in rows) >= 1  # the mesh bandit learned from its attempts
    assert len(slow.seen) == 1


def test_a_mesh_model_asked_by_name_stays_on_the_mesh_path(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    node = FakeChat("n1", tokens=4)
    with ServerThread(node.app()) as head, gateway(providers_doc(fast, slow)) as gw:
        httpx.post(f"{gw.url}/v1/nodes", json={
            "node_id": "n1", "model": "qwen", "start": 0, "end": 39, "layers": 40,
            "url": head.url, "tps": 10})
        answer = gw.chat("qwen")
        node.status = 503
        failed = gw.chat("qwen")
    assert answer.headers["x-meshroute-route"] == "qwen|n1[0-39]"
    assert answer.headers["x-meshroute-mode"]  # today's mesh answer, mode and all
    assert (answer.headers["x-meshroute-attempts"], answer.headers["x-meshroute-tried"]) == (
        "1", "qwen|n1[0-39]")  # with provider routes configured, the mesh path says it too
    assert failed.headers["x-meshroute-tried"] == "qwen|n1[0-39]"
    assert failed.status_code == 502  # issue 24: the node's 503 is an upstream failure
    assert failed.json()["error"]["code"] == "upstream_failed"  # the mesh path's exhaustion
    assert fast.seen == [] and slow.seen == []


def test_auto_aliases_order_by_their_strategy_after_warm_up(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    fast.default = Reply(tokens=8, token_delay_s=0.03)  # "fastco" is the slow one here
    doc = providers_doc(fast, slow)
    doc["providers"][0]["models"][0].update(price_in=3.0, price_out=9.0)
    with gateway(doc) as gw:
        def order(model: str) -> list[str]:
            view = httpx.get(f"{gw.url}/v1/routing/chain", params={"model": model})
            assert view.status_code == 200
            return [r["route"] for r in view.json()["chain"]]

        assert order("auto:smart") == ["fastco/big-model", "slowco/small-model"]
        for _ in range(4):
            assert gw.chat("fastco/big-model").status_code == 200
            assert gw.chat("slowco/small-model").status_code == 200
        assert order("auto:fastest") == ["slowco/small-model", "fastco/big-model"]
        assert order("auto:speed") == order("auto:fast") == order("auto:fastest")
        assert order("auto:cheap") == ["slowco/small-model", "fastco/big-model"]
        assert order("auto:smart") == ["fastco/big-model", "slowco/small-model"]
        speeds = {r["route"]: r["speed"] for r in httpx.get(
            f"{gw.url}/v1/routing/chain", params={"model": "auto:fastest"}).json()["chain"]}
        assert speeds["slowco/small-model"] > speeds["fastco/big-model"]
        picked = [gw.chat("auto:fastest").headers["x-meshroute-route"] for _ in range(6)]
    assert picked.count("slowco/small-model#1") >= 4  # Thompson draws may explore a little


def test_clearing_needs_the_admin_token_when_one_is_set(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    fast, slow = providers
    with gateway(providers_doc(fast, slow), admin_token="adm-secret") as gw:
        denied = httpx.post(f"{gw.url}/v1/cooldowns/clear")
        wrong = httpx.post(f"{gw.url}/v1/cooldowns/clear",
                           headers={"Authorization": "Bearer nope"})
        allowed = httpx.post(f"{gw.url}/v1/cooldowns/clear",
                             headers={"Authorization": "Bearer adm-secret"})
        unknown = httpx.post(f"{gw.url}/v1/cooldowns/clear", json={"route": "x/y"},
                             headers={"Authorization": "Bearer adm-secret"})
    assert denied.status_code == wrong.status_code == 401
    assert denied.json()["error"]["code"] == "invalid_token"
    assert allowed.status_code == 200 and allowed.json() == {"cleared": 0, "route": None}
    assert unknown.status_code == 404
    with gateway(providers_doc(fast, slow), node_token="node-secret") as gw:
        assert httpx.post(f"{gw.url}/v1/cooldowns/clear").status_code == 401
        assert httpx.post(f"{gw.url}/v1/cooldowns/clear",
                          headers={"Authorization": "Bearer node-secret"}).status_code == 200
    with gateway(providers_doc(fast, slow)) as gw:  # nothing configured: open
        assert httpx.post(f"{gw.url}/v1/cooldowns/clear").status_code == 200


def test_a_chains_mesh_attempt_hands_the_clients_bound_to_the_mesh_policy(
        providers: tuple[FakeProvider, FakeProvider]) -> None:
    """The mesh policy weighs re-tries by the request's max_tokens (thompson's re-tries on
    short answers): a chain's mesh attempt passes it on, as a direct mesh request does."""
    fast, slow = providers
    node = FakeChat("n1", tokens=4)
    doc = providers_doc(fast, slow, chain=("qwen", "slowco/small-model"),
                        mesh={"qwen": {"tier": "large"}})
    with ServerThread(node.app()) as head, gateway(doc) as gw:
        httpx.post(f"{gw.url}/v1/nodes", json={
            "node_id": "n1", "model": "qwen", "start": 0, "end": 39, "layers": 40,
            "url": head.url, "tps": 10})
        router = gw.gateway.router
        seen: list[int | None] = []
        choose = router.choose

        def spy(model: str, pin: Any = None, max_tokens: int | None = None,
                prefix: Any = None, needs: frozenset[str] = frozenset(), **kw: Any) -> Any:
            seen.append(max_tokens)
            return choose(model, pin, max_tokens, prefix, needs, **kw)

        router.choose = spy  # type: ignore[method-assign]
        chained = gw.chat("auto", route=["qwen"], max_completion_tokens=24)
        direct = gw.chat("qwen", max_tokens=16)
        unbounded = gw.chat("auto", route=["qwen"])
    assert (chained.status_code, direct.status_code, unbounded.status_code) == (200, 200, 200)
    assert chained.headers["x-meshroute-route"] == "qwen|n1[0-39]"
    assert seen == [24, 16, None]
