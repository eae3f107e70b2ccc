"""Issue 22, item 8 — metric series of departed models were never dropped: with
--max-nodes 16, 3,000 join / chat / leave cycles left 6,000 series and /metrics grew from
2.7 KB to 1 MB. A model's series leave with the model, and label sets are bounded overall."""

from __future__ import annotations

import httpx

from meshroute_middleware.core import NodeRecord
from meshroute_middleware.mesh import Mesh
from meshroute_middleware.middleware import build_router
from meshroute_middleware.telemetry.metrics import (
    MAX_MODEL_SERIES,
    OTHER_MODEL,
    Telemetry,
    _bump,
)

from ..security.edge_util import EdgeGateway
from ..upstream import FakeChat, ServerThread


def series(text: str, name: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(name + "{")]


def test_join_chat_leave_cycles_leave_no_series_behind() -> None:
    head = FakeChat("a")
    with ServerThread(head.app()) as up, EdgeGateway(max_nodes=16) as gw, \
            httpx.Client(base_url=gw.url) as client:
        gw.register("stays", up.url, model="kept")
        assert client.post("/v1/chat/completions", json={
            "model": "kept", "messages": [{"role": "user", "content": "hi"}]}).status_code == 200
        for i in range(300):
            assert gw.register(f"n{i}", up.url, model=f"model-{i}").status_code in (200, 201)
            chat = client.post("/v1/chat/completions", json={
                "model": f"model-{i}", "messages": [{"role": "user", "content": "hi"}]})
            assert chat.status_code == 200
            assert client.delete(f"/v1/nodes/n{i}").status_code in (200, 204)
        text = gw.gateway.telemetry.render().decode()
        decisions = series(text, "meshroute_decisions_total")
        outcomes = series(text, "meshroute_outcomes_total")
        assert decisions and all('model="kept"' in line for line in decisions), decisions
        assert outcomes and all('model="kept"' in line for line in outcomes), outcomes
        assert len(text) < 20_000, len(text)  # was ~100 bytes more for every cycle


def test_a_model_that_moves_its_last_node_away_is_forgotten() -> None:
    router = build_router()
    telemetry = Telemetry(router)
    mesh = Mesh(router, telemetry)
    mesh.upsert(NodeRecord("a", "old", 0, 0, 1, "http://127.0.0.1:9001"))
    telemetry.decisions[("old", "forward")] = 3
    mesh.upsert(NodeRecord("a", "new", 0, 0, 1, "http://127.0.0.1:9001"))  # re-announced
    assert ("old", "forward") not in telemetry.decisions


def test_label_sets_are_bounded_whatever_the_models() -> None:
    telemetry = Telemetry(build_router())
    for i in range(MAX_MODEL_SERIES + 500):
        _bump(telemetry.decisions, (f"m{i}", "forward"))
    assert len(telemetry.decisions) == MAX_MODEL_SERIES + 1  # the rest went to "other"
    assert telemetry.decisions[(OTHER_MODEL, "forward")] == 500
