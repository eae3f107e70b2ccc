"""Routes over layer shards and ADR-0021 candidate enumeration (`_enumerate_routes`)."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from .contracts.plan import PlanHop, encode_plan
from .errors import InvalidPinError
from .slot_count import route_slots
from .topology import NodeRecord

MAX_CANDIDATES = 8  # ADR-0021: "Capped at 8 candidates ranked by prior"


@dataclass(frozen=True, slots=True)
class Hop:
    """One node running layers start_layer..end_layer (inclusive) of a route."""

    node: NodeRecord
    start_layer: int
    end_layer: int

    def plan_hop(self) -> PlanHop:
        """The hop as the x-meshroute-plan header carries it (contracts.plan)."""
        return PlanHop(self.node.node_id, self.node.url, self.start_layer, self.end_layer)

    def plan_entry(self) -> dict[str, Any]:
        """The hop as it travels in the x-meshroute-plan header, JSON-ready."""
        return self.plan_hop().to_dict()


@dataclass(frozen=True, slots=True)
class Route:
    """A chain of hops serving every layer of a model; the head is always hops[0]."""

    model: str
    hops: tuple[Hop, ...]
    signature: str
    prior_tps: float
    caps: frozenset[str] = frozenset()  # what every hop serves (core/capabilities.py)
    # The fewest requests a hop runs at once (core/slot_count.py); None: a hop did not say.
    # Derived from the hops, so it takes no part in equality or hashing.
    slots: int | None = field(default=None, compare=False)

    @property
    def head(self) -> NodeRecord:
        """The node the request is proxied to (ADR-0021: always the route's own head)."""
        return self.hops[0].node

    @property
    def node_ids(self) -> tuple[str, ...]:
        """The node ids in hop order."""
        return tuple(h.node.node_id for h in self.hops)

    def plan(self) -> list[dict[str, Any]]:
        """The plan as a JSON-ready list of hops."""
        return [h.plan_entry() for h in self.hops]

    def plan_header(self) -> str:
        """The plan as the x-meshroute-plan header value (contracts.plan)."""
        return encode_plan(h.plan_hop() for h in self.hops)


def signature_of(model: str, hops: Sequence[Hop]) -> str:
    """`model|node_a[0-21]->node_b[22-39]`: the arm identity of ADR-0021."""
    chain = "->".join(f"{h.node.node_id}[{h.start_layer}-{h.end_layer}]" for h in hops)
    return f"{model}|{chain}"


def make_route(model: str, hops: Sequence[Hop]) -> Route:
    """Build a route; its prior is the bottleneck hop's effective throughput, its
    capabilities those every hop has, its slots the fewest of its hops'."""
    prior = min(h.node.effective_tps for h in hops)
    return Route(model, tuple(hops), signature_of(model, hops), prior, route_caps(hops),
                 route_slots(h.node.slots for h in hops))


def route_caps(hops: Sequence[Hop]) -> frozenset[str]:
    """What a chain serves: the capabilities every one of its hops has."""
    caps = hops[0].node.caps
    for hop in hops[1:]:
        if hop.node.caps is not caps:
            caps = caps & hop.node.caps
    return caps


class _NextHopIndex:
    """Answers 'which node starting at or before layer p reaches furthest' in O(log n)."""

    def __init__(self, nodes: Sequence[NodeRecord]) -> None:
        ordered = sorted(nodes, key=lambda n: (n.start, n.node_id))
        self._starts = [n.start for n in ordered]
        self._best: list[NodeRecord] = []
        best: NodeRecord | None = None
        best_tps = 0.0
        for node in ordered:
            tps = node.effective_tps
            if best is None or _further(node, tps, best, best_tps):
                best, best_tps = node, tps
            self._best.append(best)

    def furthest_from(self, layer: int) -> NodeRecord | None:
        """The longest-advancing node whose shard contains `layer`, or None."""
        i = bisect.bisect_right(self._starts, layer) - 1
        if i < 0:
            return None
        node = self._best[i]
        return node if node.end >= layer else None


def _further(a: NodeRecord, a_tps: float, b: NodeRecord, b_tps: float) -> bool:
    """Whether a beats b as a next hop: further end, then faster, then smaller id."""
    if a.end != b.end:
        return a.end > b.end
    if a_tps != b_tps:
        return a_tps > b_tps
    return a.node_id < b.node_id


Tail = tuple[tuple[Hop, ...], float]  # the hops from some layer to the last, their bottleneck


class _Tails:
    """Greedy completions from each start layer, each computed once.

    The greedy chain after a hop depends only on the layer it starts at, so heads that end at
    the same layer share one tail: enumeration costs O(heads + layers · log n), not
    O(heads · hops · log n).
    """

    def __init__(self, index: _NextHopIndex, last: int) -> None:
        self._index = index
        self._memo: dict[int, Tail | None] = {last + 1: ((), math.inf)}

    def from_layer(self, layer: int) -> Tail | None:
        """The greedy completion from `layer` to the last layer, or None across a gap."""
        path: list[tuple[int, NodeRecord]] = []
        while layer not in self._memo:
            node = self._index.furthest_from(layer)
            if node is None:
                self._memo[layer] = None
                break
            path.append((layer, node))
            layer = node.end + 1
        tail = self._memo[layer]
        for start, node in reversed(path):
            if tail is not None:
                tail = ((Hop(node, start, node.end), *tail[0]), min(node.effective_tps, tail[1]))
            self._memo[start] = tail
        return tail


def enumerate_routes(
    model: str, nodes: Sequence[NodeRecord], max_candidates: int = MAX_CANDIDATES,
    needs: frozenset[str] = frozenset(),
) -> tuple[Route, ...]:
    """One candidate per distinct head, greedily completed; best `max_candidates` by prior.
    With `needs`, over the nodes that have those capabilities only (every hop must)."""
    if needs:
        nodes = [n for n in nodes if needs <= n.caps]
    if not nodes:
        return ()
    last = _layer_count(nodes) - 1
    nodes = [n for n in nodes if n.layers == last + 1]
    tails = _Tails(_NextHopIndex(nodes), last)
    scored: list[tuple[float, NodeRecord, tuple[Hop, ...]]] = []
    for head in nodes:
        if head.start != 0:
            continue
        tail = tails.from_layer(head.end + 1)
        if tail is not None:  # None: a gap, this head cannot reach the last layer
            scored.append((min(head.effective_tps, tail[1]), head, tail[0]))
    return _best(model, scored, max_candidates)


def _best(model: str, scored: list[tuple[float, NodeRecord, tuple[Hop, ...]]],
          k: int) -> tuple[Route, ...]:
    """The k best by (-prior, signature); signatures are built only for the top k and ties."""
    if len(scored) > k:
        cutoff = sorted((prior for prior, _, _ in scored), reverse=True)[k - 1]
        scored = [s for s in scored if s[0] >= cutoff]
    routes = [make_route(model, (Hop(head, 0, head.end), *tail)) for _, head, tail in scored]
    routes.sort(key=lambda r: (-r.prior_tps, r.signature))
    return tuple(routes[:k])


def _layer_count(nodes: Sequence[NodeRecord]) -> int:
    """The model's layer count as most nodes report it (the larger on a tie)."""
    counts: dict[int, int] = {}
    for node in nodes:
        counts[node.layers] = counts.get(node.layers, 0) + 1
    return max(counts, key=lambda layers: (counts[layers], layers))


def pinned_route(model: str, node_ids: Sequence[str], nodes: dict[str, NodeRecord]) -> Route:
    """Build the route a request pinned; raise InvalidPinError saying what is wrong."""
    if isinstance(node_ids, str | bytes) or not node_ids:
        raise InvalidPinError("'route' must be a non-empty list of node ids")
    hops: list[Hop] = []
    layers = None
    for node_id in node_ids:
        node = nodes.get(node_id) if isinstance(node_id, str) else None
        if node is None:
            raise InvalidPinError(f"'route' names node {node_id!r}, which does not serve {model!r}")
        if layers is not None and node.layers != layers:
            raise InvalidPinError(
                f"'route' mixes layer counts: node {node_id!r} reports {node.layers} layers, "
                f"the nodes before it {layers}")
        layers = node.layers
        start = hops[-1].end_layer + 1 if hops else 0
        if not node.start <= start <= node.end:
            raise InvalidPinError(
                f"'route' does not cover {model!r} contiguously: node {node_id!r} serves "
                f"layers {node.start}-{node.end} but the hop must start at layer {start}")
        hops.append(Hop(node, start, node.end))
    assert layers is not None
    if hops[-1].end_layer != layers - 1:
        raise InvalidPinError(
            f"'route' stops at layer {hops[-1].end_layer} but {model!r} has {layers} layers")
    return make_route(model, hops)
