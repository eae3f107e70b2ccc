"""ADR-0021 route enumeration and pinned routes, table-driven and property-tested."""

from __future__ import annotations

import json
import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshroute_middleware.core import InvalidPinError, NodeRecord, enumerate_routes, pinned_route


def node(node_id: str, start: int, end: int, layers: int = 40, **kw: Any) -> NodeRecord:
    return NodeRecord(node_id, "m", start, end, layers, f"http://{node_id}.test", **kw)


GPU, CPU = node("gpu", 0, 21, tps=50.0), node("cpu", 0, 39, tps=12.0)


def sigs(nodes: list[NodeRecord], **kw: Any) -> list[str]:
    return [r.signature for r in enumerate_routes("m", nodes, **kw)]


def test_mixed_topology_enumerates_both_routes_with_bottleneck_prior() -> None:
    routes = {r.signature: r for r in enumerate_routes("m", [GPU, CPU])}
    assert set(routes) == {"m|gpu[0-21]->cpu[22-39]", "m|cpu[0-39]"}
    hybrid = routes["m|gpu[0-21]->cpu[22-39]"]
    assert hybrid.prior_tps == 12.0  # the CPU hop is the bottleneck, not the GPU's 50
    assert hybrid.head is GPU and hybrid.hops[0].node is GPU
    assert [(h.node.node_id, h.start_layer, h.end_layer) for h in hybrid.hops] == [
        ("gpu", 0, 21), ("cpu", 22, 39)]  # ADR-0020's bug was start_layer 0 here


def test_prior_uses_queue_and_reputation() -> None:
    busy_cpu = node("cpu", 0, 39, tps=12.0, queue=2, rep=0.5)  # 12 / 3 * 0.5 = 2
    routes = enumerate_routes("m", [GPU, busy_cpu])
    assert [r.prior_tps for r in routes] == [pytest.approx(2.0)] * 2


ENUMERATION = [  # (nodes, expected signatures in rank order)
    ([node("a", 0, 9), node("b", 12, 39)], []),  # a gap: no candidate
    ([node("a", 0, 9), node("b", 10, 38)], []),  # never reaches the last layer
    ([node("b", 10, 39)], []),  # nobody serves layer 0
    ([node("a", 0, 9, tps=9.0), node("b", 5, 29), node("c", 10, 39), node("d", 10, 19)],
     ["m|a[0-9]->c[10-39]"]),  # the longest-advancing next hop wins
    ([node("a", 0, 9), node("s", 10, 39, tps=5.0), node("f", 10, 39, tps=20.0)],
     ["m|a[0-9]->f[10-39]"]),  # same reach: the faster hop
    ([node("a", 0, 19, tps=8.0), node("b", 0, 39, tps=8.0), node("c", 20, 39, tps=30.0)],
     ["m|a[0-19]->c[20-39]", "m|b[0-39]"]),  # equal priors: signature order
    ([node("a", 0, 39), node("b", 0, 39, tps=5.0), node("odd", 0, 47, layers=48)],
     ["m|a[0-39]", "m|b[0-39]"]),  # a node reporting a minority layer count is left out
    ([node("a", 0, 39), node("odd", 0, 47, layers=48)], ["m|odd[0-47]"]),  # tie: the larger
]


@pytest.mark.parametrize(("nodes", "expected"), ENUMERATION)
def test_enumeration_table(nodes: list[NodeRecord], expected: list[str]) -> None:
    assert sigs(nodes) == expected


def test_at_most_max_candidates_ranked_by_prior_in_any_input_order() -> None:
    heads = [node(f"h{i:02d}", 0, 39, tps=float(i + 1)) for i in range(12)]
    expected = [f"m|h{i:02d}[0-39]" for i in range(11, 3, -1)]
    for seed in range(5):
        random.Random(seed).shuffle(heads)
        assert sigs(heads) == expected
    assert len(sigs(heads, max_candidates=3)) == 3


def test_plan_header_is_compact_json_of_the_hops() -> None:
    hybrid = enumerate_routes("m", [GPU, CPU])[0]
    plan = json.loads(hybrid.plan_header())
    assert [h["start_layer"] for h in plan] == [h.start_layer for h in hybrid.hops]
    assert plan[0]["url"] == hybrid.head.url and " " not in hybrid.plan_header()


PIN_NODES = {n.node_id: n for n in [GPU, CPU, node("tail", 30, 39), node("mid", 22, 29),
                                    node("short", 22, 35), node("other", 0, 47, layers=48)]}


@pytest.mark.parametrize(("pin", "signature"), [
    (["cpu"], "m|cpu[0-39]"),
    (["gpu", "cpu"], "m|gpu[0-21]->cpu[22-39]"),
    (["gpu", "mid", "tail"], "m|gpu[0-21]->mid[22-29]->tail[30-39]"),
])
def test_valid_pins(pin: list[str], signature: str) -> None:
    route = pinned_route("m", pin, PIN_NODES)
    assert route.signature == signature and route.head.node_id == pin[0]


@pytest.mark.parametrize(("pin", "fragment"), [
    (["ghost"], "names node 'ghost', which does not serve 'm'"),
    (["gpu", "tail"], "does not cover 'm' contiguously: node 'tail' serves layers 30-39 but "
                      "the hop must start at layer 22"),
    (["gpu"], "stops at layer 21 but 'm' has 40 layers"),
    (["gpu", "short"], "stops at layer 35"),
    (["mid", "tail"], "must start at layer 0"),
    (["gpu", "other"], "mixes layer counts"),
    ([], "non-empty list"),
    ("cpu", "non-empty list"),
    ([7], "names node 7"),
])
def test_invalid_pins_say_what_is_wrong(pin: Any, fragment: str) -> None:
    with pytest.raises(InvalidPinError) as info:
        pinned_route("m", pin, PIN_NODES)
    assert fragment in str(info.value)


@st.composite
def topologies(draw: st.DrawFn) -> tuple[int, list[NodeRecord]]:
    layers = draw(st.integers(1, 48))
    count = draw(st.integers(0, 30))
    nodes = []
    for i in range(count):
        start = draw(st.integers(0, layers - 1))
        end = draw(st.integers(start, layers - 1))
        tps = draw(st.one_of(st.sampled_from([5.0, 10.0]), st.floats(0.5, 500.0)))  # ties too
        queue = draw(st.integers(0, 5))
        nodes.append(NodeRecord(f"n{i}", "m", start, end, layers, f"http://n{i}.test", tps,
                                queue))
    return layers, nodes


@settings(max_examples=300, deadline=None)
@given(topologies(), st.integers(1, 10))
def test_every_enumerated_route_covers_all_layers_contiguously(
        topo: tuple[int, list[NodeRecord]], max_candidates: int) -> None:
    layers, nodes = topo
    routes = enumerate_routes("m", nodes, max_candidates)
    assert len(routes) <= max_candidates
    heads = [r.head.node_id for r in routes]
    assert len(set(heads)) == len(heads)  # one candidate per distinct head
    for route in routes:
        assert route.hops[0].start_layer == 0 and route.head is route.hops[0].node
        for prev, hop in zip(route.hops, route.hops[1:], strict=False):
            assert hop.start_layer == prev.end_layer + 1
        for hop in route.hops:
            assert hop.node.start <= hop.start_layer <= hop.end_layer == hop.node.end
        assert route.hops[-1].end_layer == layers - 1
        assert route.prior_tps == min(h.node.effective_tps for h in route.hops)
    priors = [r.prior_tps for r in routes]
    assert priors == sorted(priors, reverse=True)
    shuffled = list(nodes)
    random.Random(len(nodes)).shuffle(shuffled)
    assert enumerate_routes("m", shuffled, max_candidates) == routes  # deterministic
    if any(n.start == 0 and n.end == layers - 1 for n in nodes):
        assert routes  # a node serving every layer is always a candidate route


def reference_enumeration(nodes: list[NodeRecord], k: int) -> list[tuple[str, float]]:
    """ADR-0021 by brute force: per head, repeatedly the node reaching furthest (then faster,
    then smaller id) among those serving the next layer."""
    counts = Counter(n.layers for n in nodes)
    layers = max(counts, key=lambda c: (counts[c], c))
    nodes = [n for n in nodes if n.layers == layers]
    found = []
    for head in (n for n in nodes if n.start == 0):
        hops = [(head, 0)]
        while (end := hops[-1][0].end) < layers - 1:
            options = [n for n in nodes if n.start <= end + 1 <= n.end]
            if not options:
                break
            hops.append((min(options, key=lambda n: (-n.end, -n.effective_tps, n.node_id)),
                         end + 1))
        else:
            chain = "->".join(f"{n.node_id}[{s}-{n.end}]" for n, s in hops)
            found.append((f"m|{chain}", min(n.effective_tps for n, _ in hops)))
    found.sort(key=lambda r: (-r[1], r[0]))
    return found[:k]


@settings(max_examples=300, deadline=None)
@given(topologies(), st.integers(1, 10), st.integers(1, 48))
def test_enumeration_equals_brute_force_reference(
        topo: tuple[int, list[NodeRecord]], max_candidates: int, odd_layers: int) -> None:
    _, nodes = topo
    if nodes and odd_layers != nodes[0].layers:  # a node reporting another layer count
        nodes = [*nodes, NodeRecord("odd", "m", 0, odd_layers - 1, odd_layers, "http://o.test")]
    got = [(r.signature, r.prior_tps) for r in enumerate_routes("m", nodes, max_candidates)]
    assert got == (reference_enumeration(nodes, max_candidates) if nodes else [])
