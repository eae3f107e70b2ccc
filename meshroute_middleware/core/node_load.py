"""What a tracker knows of a node's load beyond its own requests (issue 31).

Several trackers share nodes, and each counts only the requests it sent. A node tells its
true load, every sender's requests, when asked: on every answer (the node agent's response
header, `x-meshroute-load`) and in what it pushes to trackers. `NodeLoads` turns those reports
into the requests *others* hold on a node: the report's count less this tracker's own
requests on the node at that moment, held until the next report and forgotten after
`REPORT_TTL_S` (a node that stopped reporting is not believed full forever). A route's load
is then its own in-flight count plus the others' on its busiest hop. Pure: `now` is passed in.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from .contracts.load import MAX_HELD

# A report older than this says nothing: the others' requests it counted have long ended
# (answers of a few seconds; reports come on every answer and every push, well under a
# second apart on a busy node: docs/benchmarks.md, "Slot-limited meshes and several
# trackers").
REPORT_TTL_S = 5.0
MAX_NODES = 4096  # reports kept before the oldest are dropped


@dataclass(slots=True)
class NodeLoads:
    """Per node, this tracker's own requests in flight and the others' last reported."""

    ttl_s: float = REPORT_TTL_S
    own: dict[str, int] = field(default_factory=dict)  # node -> own requests in flight
    others: dict[str, tuple[int, float]] = field(default_factory=dict)  # node -> (count, t)

    def begin(self, node_ids: Iterable[str]) -> None:
        """An own request starts on these nodes."""
        own = self.own
        for node in node_ids:
            own[node] = own.get(node, 0) + 1

    def end(self, node_ids: Iterable[str]) -> None:
        """An own request on these nodes ended."""
        own = self.own
        for node in node_ids:
            left = own.get(node, 0) - 1
            if left > 0:
                own[node] = left
            else:
                own.pop(node, None)

    def report(self, node_id: str, held: int, now: float) -> int:
        """The node says it holds `held` requests now (running and queued, from every
        sender); return the others' count it implies (the report less our own)."""
        if not 0 <= held <= MAX_HELD:
            return self.others.get(node_id, (0, now))[0]
        others = max(held - self.own.get(node_id, 0), 0)
        if node_id not in self.others and len(self.others) >= MAX_NODES:
            oldest = min(self.others, key=lambda n: self.others[n][1])
            del self.others[oldest]
        self.others[node_id] = (others, now)
        return others

    def others_on(self, node_ids: Iterable[str], now: float) -> int:
        """The others' requests on the busiest of these nodes, as last reported (0 when no
        report is fresher than the TTL)."""
        out = 0
        reports = self.others
        for node in node_ids:
            seen = reports.get(node)
            if seen is not None and now - seen[1] <= self.ttl_s and seen[0] > out:
                out = seen[0]
        return out

    def age(self, node_id: str, now: float) -> float | None:
        """Seconds since the node's last report (None: never, or forgotten)."""
        seen = self.others.get(node_id)
        return None if seen is None else now - seen[1]
