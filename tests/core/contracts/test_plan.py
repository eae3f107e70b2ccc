"""The x-meshroute-plan header: what the gateway writes, a node parses back, strictly."""

from __future__ import annotations

import json

import pytest

from meshroute_middleware.core import NodeRecord
from meshroute_middleware.core.contracts.plan import (
    MAX_PLAN_CHARS,
    MAX_PLAN_HOPS,
    PlanError,
    PlanHop,
    encode_plan,
    parse_plan,
)
from meshroute_middleware.core.routes import Hop, make_route

A = NodeRecord("a", "m", 0, 21, 40, "http://127.0.0.1:8001")
B = NodeRecord("b", "m", 22, 39, 40, "http://127.0.0.1:8002/")


def test_a_routes_header_parses_back_to_its_hops() -> None:
    route = make_route("m", [Hop(A, 0, 21), Hop(B, 22, 39)])
    raw = route.plan_header()
    assert raw == encode_plan(h.plan_hop() for h in route.hops)
    assert " " not in raw and json.loads(raw) == route.plan()
    assert parse_plan(raw) == [PlanHop("a", A.url, 0, 21),
                               PlanHop("b", "http://127.0.0.1:8002", 22, 39)]


def hop(**changes: object) -> dict[str, object]:
    entry: dict[str, object] = {"node_id": "a", "url": "http://h:1", "start_layer": 0,
                                "end_layer": 3}
    entry.update(changes)
    return entry


@pytest.mark.parametrize(("raw", "reason"), [
    ("[{", "not JSON"),
    ("{}", "list of 1"),
    ("[]", "list of 1"),
    (json.dumps([hop()] * (MAX_PLAN_HOPS + 1)), "list of 1"),
    ("[" + " " * MAX_PLAN_CHARS + "]", "too long"),
    (json.dumps(["a"]), "object"),
    (json.dumps([hop(node_id=7)]), "string"),
    (json.dumps([hop(node_id="")]), "node_id"),
    (json.dumps([hop(node_id="n" * 129)]), "node_id"),
    (json.dumps([hop(url="file:///etc/passwd")]), "http"),
    (json.dumps([hop(start_layer=True)]), "integer"),
    (json.dumps([hop(start_layer=1.0)]), "integer"),
    (json.dumps([hop(start_layer=4, end_layer=3)]), "integer"),
    (json.dumps([hop(start_layer=-1)]), "integer"),
    (json.dumps([hop(), hop(node_id="b", start_layer=5, end_layer=9)]), "expected 4"),
])
def test_malformed_plans_are_refused_saying_why(raw: str, reason: str) -> None:
    with pytest.raises(PlanError, match=reason):
        parse_plan(raw)


def test_plan_error_is_a_value_error() -> None:
    assert issubclass(PlanError, ValueError)
