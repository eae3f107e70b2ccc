"""The x-meshroute-plan header: the hops of a route, from the gateway to the route's head and
from each hop to the next.

The value is compact JSON, a list of 1..64 hops, each
`{"node_id": str, "url": "http(s)://...", "start_layer": int, "end_layer": int}` with
0 <= start_layer <= end_layer, every hop starting where the one before it ended. `encode_plan`
writes it, `parse_plan` reads it strictly; a node then checks that the plan fits it.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from ..errors import MeshRouteError
from .limits import MAX_ID_CHARS

PLAN_HEADER: Final = "x-meshroute-plan"  # the hops (this module)
ROUTE_HEADER: Final = "x-meshroute-route"  # the route signature
MODE_HEADER: Final = "x-meshroute-mode"  # the decision mode (kinds.DecisionMode)
MAX_PLAN_HOPS: Final = 64
MAX_PLAN_CHARS: Final = 16_384
MAX_URL_CHARS: Final = 2048  # as topology.parse_node


class PlanError(MeshRouteError, ValueError):
    """The plan header is malformed; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class PlanHop:
    """One hop of a plan: a node, its base URL and its layer span (inclusive)."""

    node_id: str
    url: str
    start_layer: int
    end_layer: int

    @property
    def span(self) -> int:
        """Layers this hop runs."""
        return self.end_layer - self.start_layer + 1

    def to_dict(self) -> dict[str, Any]:
        """The hop as it travels in the plan header."""
        return {"node_id": self.node_id, "url": self.url,
                "start_layer": self.start_layer, "end_layer": self.end_layer}


def encode_plan(hops: Iterable[PlanHop]) -> str:
    """The header value: compact JSON of the hops in order."""
    return json.dumps([h.to_dict() for h in hops], separators=(",", ":"))


def _hop(entry: Any) -> PlanHop:
    if not isinstance(entry, dict):
        raise PlanError("each plan hop must be an object")
    node_id, url = entry.get("node_id"), entry.get("url")
    start, end = entry.get("start_layer"), entry.get("end_layer")
    if not isinstance(node_id, str) or not isinstance(url, str):
        raise PlanError("plan hop needs string 'node_id' and 'url'")
    if not 0 < len(node_id) <= MAX_ID_CHARS:
        raise PlanError(f"plan hop 'node_id' must hold 1..{MAX_ID_CHARS} characters")
    if not url.startswith(("http://", "https://")) or len(url) > MAX_URL_CHARS:
        raise PlanError(f"plan hop url must be http(s), got {url[:64]!r}")
    if type(start) is not int or type(end) is not int or not 0 <= start <= end:
        raise PlanError("plan hop needs integer 0 <= 'start_layer' <= 'end_layer'")
    return PlanHop(node_id, url.rstrip("/"), start, end)


def parse_plan(raw: str) -> list[PlanHop]:
    """The hops of a header value; PlanError unless it is exactly the schema above."""
    if len(raw) > MAX_PLAN_CHARS:
        raise PlanError("plan header too long")
    try:
        entries = json.loads(raw)
    except ValueError:
        raise PlanError("plan header is not JSON") from None
    if not isinstance(entries, list) or not 0 < len(entries) <= MAX_PLAN_HOPS:
        raise PlanError(f"plan must be a list of 1..{MAX_PLAN_HOPS} hops")
    hops = [_hop(e) for e in entries]
    for prev, nxt in itertools.pairwise(hops):
        if nxt.start_layer != prev.end_layer + 1:
            raise PlanError(f"plan hop {nxt.node_id} starts at {nxt.start_layer}, "
                            f"expected {prev.end_layer + 1}")
    return hops
