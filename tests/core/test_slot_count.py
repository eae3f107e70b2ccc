"""A server's slot count: bounded as hostile input, carried both ways, and a route's the
fewest of its hops' (core/slot_count.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from meshroute_middleware.core import InvalidNodeError, NodeRecord, Router, parse_node
from meshroute_middleware.core.contracts.limits import MAX_SLOTS
from meshroute_middleware.core.contracts.txt import decode_node, encode_node
from meshroute_middleware.core.routes import enumerate_routes, pinned_route
from meshroute_middleware.core.slot_count import parse_slot_count, route_slots

BASE = {"node_id": "a", "model": "m", "start": 0, "end": 31, "layers": 32,
        "url": "http://a.test", "tps": 10.0}


def test_a_record_carries_its_slot_count_both_ways() -> None:
    record = parse_node({**BASE, "slots": 8})
    assert record.slots == 8 and record.to_dict()["slots"] == 8
    assert parse_node(record.to_dict()) == record
    props = encode_node(record, "s3cret")
    assert props["sl"] == "8"
    assert decode_node(props, secret="s3cret") == record


def test_a_record_without_slots_is_as_before() -> None:
    plain = parse_node(BASE)
    assert plain.slots is None and "slots" not in plain.to_dict()
    assert "sl" not in encode_node(plain)
    assert plain == NodeRecord("a", "m", 0, 31, 32, "http://a.test", 10.0)


@pytest.mark.parametrize(("value", "slots"), [
    (1, 1), (MAX_SLOTS, MAX_SLOTS), ("8", 8), (" 8 ", 8), (4.0, 4), (None, None), ("", None),
])
def test_slot_counts_taken(value: Any, slots: int | None) -> None:
    assert parse_slot_count({"slots": value}) == slots


@pytest.mark.parametrize("value", [
    0, -1, MAX_SLOTS + 1, 10**400, True, False, 4.5, float("nan"), float("inf"), 1e300,
    "0", "65537", "4.0", "-4", "+4", "0x10", "1_0", "١٢", "٤", "9" * 40, "four", [4], {"n": 4},
])
def test_hostile_slot_counts_reject_the_record(value: Any) -> None:
    with pytest.raises(InvalidNodeError, match=r"'slots' must be an integer in 1\.\.65536"):
        parse_node({**BASE, "slots": value})


@pytest.mark.parametrize("text", ["0", "1.5", "x", "٤", "99999999999999999999"])
def test_a_hostile_txt_slot_count_rejects_the_record(text: str) -> None:
    props = {**encode_node(parse_node(BASE)), "sl": text}
    with pytest.raises(InvalidNodeError, match="'slots'"):
        decode_node(props)


def _node(node_id: str, start: int, end: int, slots: int | None) -> NodeRecord:
    return NodeRecord(node_id, "m", start, end, 32, f"http://{node_id}.test", 10.0,
                      slots=slots)


@pytest.mark.parametrize(("slots", "expected"), [
    ((8, 4), 4), ((2, 16), 2), ((8, None), None), ((None, 8), None), ((None, None), None),
])
def test_a_chains_slots_are_its_narrowest_hops(slots: tuple[int | None, int | None],
                                               expected: int | None) -> None:
    head, tail = _node("h", 0, 15, slots[0]), _node("t", 16, 31, slots[1])
    (route,) = enumerate_routes("m", [head, tail])
    assert route.slots == expected
    assert pinned_route("m", ["h", "t"], {"h": head, "t": tail}).slots == expected


def test_a_single_hops_slots_are_its_own() -> None:
    (route,) = enumerate_routes("m", [_node("a", 0, 31, 6)])
    assert route.slots == 6
    assert route_slots([]) is None


def test_route_equality_and_hash_ignore_the_derived_slots() -> None:
    (route,) = enumerate_routes("m", [_node("a", 0, 31, 6)])
    other = replace(route, slots=None)
    assert other == route and hash(other) == hash(route)
    assert route.signature == "m|a[0-31]"


def test_the_routers_candidates_follow_a_changed_slot_count() -> None:
    router = Router(clock=lambda: 0.0)
    router.upsert_node(_node("a", 0, 31, None))
    assert [r.slots for r in router.candidates("m")] == [None]
    assert router.upsert_node(_node("a", 0, 31, 4)) == "refresh"
    assert [r.slots for r in router.candidates("m")] == [4]


def test_the_routing_table_shows_each_routes_slots() -> None:
    router = Router(clock=lambda: 0.0)
    router.upsert_node(_node("a", 0, 15, 8))
    router.upsert_node(_node("b", 16, 31, 4))
    router.upsert_node(_node("c", 0, 31, None))
    rows = router.routing_table("m")["models"]["m"]["candidates"]
    assert {row["signature"]: row["slots"] for row in rows} == {
        "m|a[0-15]->b[16-31]": 4, "m|c[0-31]": None}
