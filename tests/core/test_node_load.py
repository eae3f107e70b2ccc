"""What a tracker knows of a node's load beyond its own requests (issue 31): the nodes'
reports (an answer's header, a push) less our own requests, held until the TTL."""

from __future__ import annotations

from dataclasses import replace

import pytest

from meshroute_middleware.core import InvalidNodeError, NodeRecord, Outcome, Router, RouterConfig
from meshroute_middleware.core.cache_prior import CachePrior
from meshroute_middleware.core.contracts.load import MAX_HELD, parse_held
from meshroute_middleware.core.contracts.txt import decode_node, encode_node
from meshroute_middleware.core.node_load import (
    RECORD_LAG_S,
    REPORT_TTL_S,
    NodeLoads,
    parse_held_field,
)
from meshroute_middleware.core.topology import parse_node

from ..conftest import FakeClock


@pytest.mark.parametrize(("own", "held", "others"), [
    (0, 0, 0), (0, 3, 3), (2, 3, 1), (2, 2, 0),
    (3, 1, 0),  # a report older than our own newest request: never below zero
])
def test_a_report_less_our_own_requests_is_the_others(own: int, held: int, others: int) -> None:
    loads = NodeLoads()
    for _ in range(own):
        loads.begin(("gpu",))
    assert loads.report("gpu", held, 10.0) == others
    assert loads.others_on(("gpu",), 10.0) == others


@pytest.mark.parametrize(("age_s", "seen"), [
    (0.0, 4), (REPORT_TTL_S, 4), (REPORT_TTL_S + 0.001, 0),
])
def test_a_report_is_forgotten_after_the_ttl(age_s: float, seen: int) -> None:
    loads = NodeLoads()
    loads.report("gpu", 4, 100.0)
    assert loads.others_on(("gpu",), 100.0 + age_s) == seen
    assert loads.age("gpu", 100.0 + age_s) == pytest.approx(age_s)


def test_a_route_counts_the_others_on_its_busiest_hop() -> None:
    loads = NodeLoads()
    loads.report("head", 1, 0.0)
    loads.report("tail", 3, 0.0)
    assert loads.others_on(("head", "tail"), 0.0) == 3
    assert loads.others_on(("head",), 0.0) == 1
    assert loads.others_on(("elsewhere",), 0.0) == 0
    assert loads.age("elsewhere", 0.0) is None


@pytest.mark.parametrize("held", [-1, MAX_HELD + 1])
def test_a_report_out_of_range_is_not_believed(held: int) -> None:
    loads = NodeLoads()
    loads.report("gpu", 2, 0.0)
    assert loads.report("gpu", held, 1.0) == 2
    assert loads.others_on(("gpu",), 1.0) == 2


def test_own_requests_end_where_they_began() -> None:
    loads = NodeLoads()
    loads.begin(("a", "b"))
    loads.begin(("a",))
    loads.end(("a", "b"))
    assert loads.own == {"a": 1}
    loads.end(("a",))
    loads.end(("a",))  # ending twice never goes negative
    assert loads.own == {}


def router(clock: FakeClock) -> Router:
    r = Router(RouterConfig(policy="thompson"), clock=clock)
    for name, tps, slots in (("gpu", 2000.0, 2), ("cpu", 500.0, 8)):
        r.upsert_node(NodeRecord(name, "m", 0, 31, 32, f"http://{name}.test", tps,
                                 slots=slots))
    return r


def in_flight(r: Router) -> dict[str, int]:
    return {a.route.head.node_id: a.in_flight for a in r.arms("m")}


def test_the_router_adds_the_others_requests_to_each_route(clock: FakeClock) -> None:
    r = router(clock)
    mine = r.choose("m", pin=["gpu"])
    assert in_flight(r) == {"gpu": 1, "cpu": 0}
    r.note_load("gpu", 3)  # our one and two another tracker sent
    r.note_load("cpu", 0)
    assert in_flight(r) == {"gpu": 3, "cpu": 0}
    second = r.choose("m", pin=["gpu"])
    assert second.ahead == 3  # what its first token waits behind: every sender's
    r.record(mine, Outcome(300, 0.3, 0.01))
    assert in_flight(r) == {"gpu": 3, "cpu": 0}  # the others' two until the next report
    clock.advance(REPORT_TTL_S + 1.0)
    assert in_flight(r) == {"gpu": 1, "cpu": 0}  # a silent node's report expires
    r.record(second, Outcome(300, 0.3, 0.01))
    assert in_flight(r) == {"gpu": 0, "cpu": 0}


def test_a_sample_carries_the_nodes_concurrency_not_only_ours(clock: FakeClock) -> None:
    r = router(clock)
    d = r.choose("m", pin=["gpu"])
    clock.advance(1.0)  # alone for a second
    r.note_load("gpu", 3)  # then two others' requests beside it for a second
    clock.advance(1.0)
    assert r.concurrency(d, clock()) == pytest.approx(2.0)  # (1 x 1 s + 3 x 1 s) / 2 s


def taught(clock: FakeClock) -> Router:
    """A router that has measured both nodes alone: 2,000 and 500 tok/s."""
    r = router(clock)
    for name, tps in (("gpu", 2000.0), ("cpu", 500.0)):
        for _ in range(20):
            d = r.choose("m", pin=[name])
            r.record(d, Outcome(300, 300 / tps, 0.001))
    return r


@pytest.mark.parametrize(("reported", "want"), [
    (None, "gpu"),  # no report: each tracker sees its own one request and a free slot
    (2, "cpu"),  # the node says both its slots are taken: the node with room
])
def test_three_trackers_keep_the_full_node_for_two(clock: FakeClock, reported: int | None,
                                                   want: str) -> None:
    """Two trackers each run one request on the 2-slot node; the third decides next."""
    trackers = [taught(clock) for _ in range(3)]
    for t in trackers[:2]:
        t.choose("m", pin=["gpu"])
    third = trackers[2]
    if reported is not None:  # the agent's header on an answer, or its push
        third.note_load("gpu", reported)
        third.note_load("cpu", 0)
    picks = set()
    for _ in range(20):
        d = third.choose("m")
        picks.add(d.route.head.node_id)
        third.cancel(d)
    assert picks == {want}


@pytest.mark.parametrize(("value", "held"), [
    (b"0", 0), (b"12", 12), (" 7 ", 7), (b"65536", 65536),
    (None, None), (b"", None), (b"-1", None), (b"1.5", None), (b"3, 4", None),
    (b"65537", None), (b"9999999", None), ("\u0663", None),  # an Arabic-Indic digit
])
def test_the_load_header_is_a_plain_count(value: bytes | str | None, held: int | None) -> None:
    assert parse_held(value) == held


# -- a node's record carries its engine's load (`held`, TXT `hd`) -------------------------
@pytest.mark.parametrize(("value", "held"), [
    (None, None), ("", None), (0, 0), ("3", 3), (" 12 ", 12), (65536, 65536),
])
def test_a_record_may_carry_its_engines_held_requests(value: object, held: int | None) -> None:
    assert parse_held_field({} if value is None else {"held": value}) == held
    record = NodeRecord("gpu", "m", 0, 31, 32, "http://gpu.test", held=held)
    assert parse_node(record.to_dict()).held == held
    assert decode_node(encode_node(record)).held == held
    assert ("hd" in encode_node(record)) == (held is not None)


@pytest.mark.parametrize("value", [-1, 65537, 1.5, True, "x", "1_0", "\u0663", [2]])
def test_a_hostile_held_field_rejects_the_record(value: object) -> None:
    with pytest.raises(InvalidNodeError, match="held"):
        parse_node({**NodeRecord("gpu", "m", 0, 31, 32, "http://gpu.test").to_dict(),
                    "held": value})


def test_a_records_held_requests_are_the_others_load(clock: FakeClock) -> None:
    r = router(clock)
    gpu = r.topology.node("gpu")
    assert gpu is not None
    version = r.topology.model("m").version  # type: ignore[union-attr]
    r.upsert_node(replace(gpu, held=2))  # two requests another tracker (or a client) sent
    assert in_flight(r) == {"gpu": 2, "cpu": 0}
    assert r.topology.model("m").version == version  # type: ignore[union-attr]
    assert r.topology.node("gpu").held is None  # type: ignore[union-attr]
    mine = r.choose("m", pin=["gpu"])
    r.upsert_node(replace(gpu, held=3))  # ours among them
    assert in_flight(r) == {"gpu": 3, "cpu": 0}
    clock.advance(0.5)
    r.record(mine, Outcome(300, 0.3, 0.01))
    # a record read before ours ended may still count it: it is not taken for another's
    r.upsert_node(replace(gpu, held=3))
    assert in_flight(r) == {"gpu": 2, "cpu": 0}
    clock.advance(RECORD_LAG_S + 0.1)
    r.upsert_node(replace(gpu, held=3))  # long after: three others now
    assert in_flight(r) == {"gpu": 3, "cpu": 0}
    r.upsert_node(replace(gpu, held=0))
    assert in_flight(r) == {"gpu": 0, "cpu": 0}


def test_an_answers_header_is_taken_as_of_now(clock: FakeClock) -> None:
    loads = NodeLoads()
    loads.begin(("gpu",))
    loads.end(("gpu",), 10.0)
    assert loads.report("gpu", 1, 10.1) == 1  # the header is written as the answer starts
    loads.begin(("gpu",))
    loads.end(("gpu",), 11.0)
    assert loads.report("gpu", 1, 11.5, lag_s=1.0) == 0  # a record may predate our end


def test_a_full_signed_record_with_its_serial_fits_the_txt_limits() -> None:
    record = NodeRecord("gpu", "m", 0, 31, 32, "http://gpu.test", cache=CachePrior(0.5, 4096),
                        slots=4, held=3)
    props = encode_node(record, "s3cret", serial=123456)
    assert props["n"] == "123456"
    assert decode_node(props, secret="s3cret") == record


def test_a_node_that_never_reported_keeps_no_end_times() -> None:
    loads = NodeLoads()
    for i in range(200):
        loads.begin(["quiet"])
        loads.end(["quiet"], now=float(i))
    assert "quiet" not in loads.ended and "quiet" not in loads.own
    loads.report("busy", 0, 0.0)
    loads.begin(["busy"])
    loads.end(["busy"], now=1.0)
    assert loads.ended["busy"] == [1.0]  # a reporting node's own ends are still kept
