"""What a tracker knows of a node's load beyond its own requests (issue 31).

Several trackers share nodes, and each counts only the requests it sent. A node tells its
true load, every sender's requests, when asked: on every answer (the node agent's response
header, `x-meshroute-load`) and in what it pushes to trackers. `NodeLoads` turns those reports
into the requests *others* hold on a node: the report's count less this tracker's own
requests on the node at that moment, held until the next report and forgotten after
`REPORT_TTL_S` (a node that stopped reporting is not believed full forever). A route's load
is then its own in-flight count plus the others' on its busiest hop. Pure: `now` is passed in.

A node fronting an engine it does not proxy (llama.cpp, vLLM, SGLang: the gateway talks to
the engine itself, and no header comes back) carries the count in its record instead: the
field `held` (TXT `hd`), the engine's running plus waiting requests as its agent last read
them (node_agent/load.py), refreshed within a fraction of a second of a change
(docs/architecture.md, "One node, several trackers"). Such a report is as old as that
reading: own requests that ended within `lag_s` before it may still be in it, and are not
taken for the others'.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .contracts.load import MAX_HELD
from .errors import InvalidNodeError

# A report older than this says nothing: the others' requests it counted have long ended
# (answers of a few seconds; reports come on every answer and every push, well under a
# second apart on a busy node: docs/benchmarks.md, "Slot-limited meshes and several
# trackers").
REPORT_TTL_S = 5.0
MAX_NODES = 4096  # reports kept before the oldest are dropped
HELD_KEY: Final = "held"
# How old a record's `held` may be when a tracker takes it in: the agent reads the engine
# every 0.25 s and publishes a change at most every 0.25 s (node_agent/load.py POLL_S,
# node_agent/announcer.py HELD_MIN_INTERVAL_S), plus delivery.
RECORD_LAG_S = 1.0
MAX_ENDS = 64  # own ends remembered per node (the most a record's lag may still count)


def parse_held_field(data: Mapping[str, Any]) -> int | None:
    """A record's `held` (requests its engine runs and queues, every sender's), bounded;
    None when it has none; InvalidNodeError for a value that is not a count in 0..MAX_HELD."""
    value = data.get(HELD_KEY)
    if value is None or value == "":
        return None
    if isinstance(value, str):
        text = value.strip()
        if not (text.isascii() and text.isdigit() and len(text) <= len(str(MAX_HELD))):
            raise InvalidNodeError(f"'{HELD_KEY}' must be an integer in 0..{MAX_HELD}, "
                                   f"got {text[:16]!r}")
        value = int(text)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_HELD:
        raise InvalidNodeError(f"'{HELD_KEY}' must be an integer in 0..{MAX_HELD}, "
                               f"got {str(value)[:16]!r}")
    return value


def held_fields(held: int | None) -> dict[str, int]:
    """The count as record fields (what parse_held_field reads back); {} for none."""
    return {} if held is None else {HELD_KEY: held}


@dataclass(slots=True)
class NodeLoads:
    """Per node, this tracker's own requests in flight and the others' last reported."""

    ttl_s: float = REPORT_TTL_S
    own: dict[str, int] = field(default_factory=dict)  # node -> own requests in flight
    others: dict[str, tuple[int, float]] = field(default_factory=dict)  # node -> (count, t)
    ended: dict[str, list[float]] = field(default_factory=dict)  # node -> own ends' times

    def begin(self, node_ids: Iterable[str]) -> None:
        """An own request starts on these nodes."""
        own = self.own
        for node in node_ids:
            own[node] = own.get(node, 0) + 1

    def end(self, node_ids: Iterable[str], now: float | None = None) -> None:
        """An own request on these nodes ended (at `now`, remembered for lagging reports)."""
        own = self.own
        for node in node_ids:
            if now is not None and node in self.others:  # only a reporting node lags
                ends = self.ended.setdefault(node, [])
                ends.append(now)
                if len(ends) > MAX_ENDS:
                    del ends[0]
            left = own.get(node, 0) - 1
            if left > 0:
                own[node] = left
            else:
                own.pop(node, None)

    def report(self, node_id: str, held: int, now: float, lag_s: float = 0.0) -> int:
        """The node says it holds `held` requests (running and queued, from every sender),
        as of at most `lag_s` ago; return the others' count it implies (the report less our
        own, and less our own that ended within the lag: the report may still count them)."""
        if not 0 <= held <= MAX_HELD:
            return self.others.get(node_id, (0, now))[0]
        mine = self.own.get(node_id, 0)
        ends = self.ended.get(node_id)
        if ends:
            ends[:] = [t for t in ends if now - t < lag_s]
            mine += len(ends)
            if not ends:
                del self.ended[node_id]
        others = max(held - mine, 0)
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
