"""One exhaustion answer (issue 36): the mesh path and the provider chain answer a request no
route answered with the same error — the same status and code per cause, the same `routes`
list of `{"route", "reason", "until"}` — because both run the one attempt lifecycle."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from meshroute_middleware.core import parse_node

from .fake_provider import FakeProvider, Reply
from .gateway import HI, gateway, providers_doc

CAUSES = [  # (what every upstream answers, status, code, reason of each route, keys tried)
    (Reply.rate_limited("30"), 429, "rate_limited", "http_429",
     {"fastco/big-model#1", "fastco/big-model#2", "slowco/small-model#1"}),
    (Reply.error(500), 502, "upstream_failed", "http_5xx",  # a 5xx moves to the next route
     {"fastco/big-model#1", "slowco/small-model#1"}),
]


def add_mesh_nodes(gw: Any, head: FakeProvider) -> None:
    """Two mesh routes of model `m`, both heads `head` (its URL without `/v1`)."""
    url = head.base_url.removesuffix("/v1")
    for name in ("a", "b"):
        gw.gateway.mesh.upsert(parse_node({"node_id": name, "model": "m", "start": 0,
                                           "end": 39, "layers": 40, "url": url}))


def error_of(answer: httpx.Response) -> dict[str, Any]:
    error: dict[str, Any] = answer.json()["error"]
    return error


@pytest.mark.parametrize(("reply", "status", "code", "reason", "keys"), CAUSES)
def test_the_mesh_and_the_chain_answer_exhaustion_alike(
        providers: tuple[FakeProvider, FakeProvider], reply: Reply, status: int, code: str,
        reason: str, keys: set[str]) -> None:
    fast, slow = providers
    fast.default = slow.default = reply
    with gateway(providers_doc(fast, slow)) as gw:
        add_mesh_nodes(gw, slow)
        chain = gw.chat("auto")
        mesh = httpx.post(f"{gw.url}/v1/chat/completions", timeout=30,
                          json={"model": "m", "messages": HI})
    for answer in (chain, mesh):
        assert answer.status_code == status, answer.text
        error = error_of(answer)
        assert error["code"] == code
        assert isinstance(error["routes"], list) and error["routes"]
        for route in error["routes"]:
            assert set(route) == {"route", "reason", "until"}
            assert route["reason"] == reason
        if status == 429:
            assert route["until"] is not None and int(answer.headers["retry-after"]) >= 1
        else:
            assert route["until"] is None and "retry-after" not in answer.headers
    assert error_of(chain)["type"] == error_of(mesh)["type"]
    assert {r["route"] for r in error_of(chain)["routes"]} == keys
    assert {r["route"] for r in error_of(mesh)["routes"]} == {"m|a[0-39]", "m|b[0-39]"}
