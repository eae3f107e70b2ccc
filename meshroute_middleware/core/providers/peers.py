"""What trackers that gossip (and share no limits store) learn of each other's provider keys.

Each origin tracker writes one `PeerState` of its own (last writer wins per origin, by the
origin's `t`), and every tracker keeps and relays the newest report of every origin it has
heard of (`Peers.merge_all`: per-origin LWW, so the merge is idempotent, commutative and
associative and converges over any connected peer graph, as mesh route entries do; a report
for our own origin from elsewhere is never taken; an origin not refreshed for `REPORT_TTL_S`
ages out). A report carries its origin's learned statistics per provider route, its cooldowns
and revocations with when they were set, the clears it received with when, and its usage per
key in its current minute and UTC day. A tracker then
- ranks a provider route by its own statistics and its peers' together (`merged_stats`: the
  outcome counts summed, tok/s and TTFB weighted by successes, the worst penalty), so a route
  that failed on a peer ranks low before this tracker ever called it;
- honours a peer's cooldown (a max-register of its end) and revocation, unless a clear newer
  than it is known (a clear is a time that supersedes whatever was set before it);
- admits a request on a key only while its own usage plus every peer's stays under the limit
  (`PeerUsage`). Peers' counts are as of their last report, so overshoot is bounded by what
  the peers admitted within one gossip round (docs/providers.md).
Pure: `now` is passed in.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from ..defaults import MAX_SKEW_S
from .scoring import RouteStats

MINUTE_S = 60.0
DAY_S = 86_400.0
REPORT_TTL_S = 600.0  # an origin whose report is older ages out: a departed tracker's day
# usage, cooldowns and revocations stop counting (its minute usage already after MINUTE_S)
MAX_ORIGINS = 256  # origins a tracker keeps reports of; reports of more are refused
MAX_CLEARS = 4096  # clears remembered past their report's age (oldest forgotten first)

# reasons a report is refused, counted by gossip (GossipCounters.entries_refused)
OWN_ORIGIN = "own_origin"  # a report for our own origin from a peer (forged or an echo)
NOT_RELAYED = "unauthenticated_relay"  # another origin's report without a shared secret
FUTURE = "future"  # dated past our clock by more than MAX_SKEW_S
STORE_FULL = "store_full"  # MAX_ORIGINS reached


# (route, key, served at, prompt tokens, cache ttl s): affinity.Held's fields, in its order
Moved = tuple[str, int, float, int, float]


class Usage(NamedTuple):
    """One key's use in its tracker's windows: the sliding minute and the UTC day."""

    minute_requests: int = 0
    minute_tokens: int = 0
    day: int = -1
    day_requests: int = 0
    day_tokens: int = 0


@dataclass(frozen=True, slots=True)
class PeerState:
    """One origin's report, as of its `t`."""

    t: float
    stats: dict[str, RouteStats] = field(default_factory=dict)  # route -> learned there
    cooldowns: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)
    # (route, key) -> (until, set at)
    revoked: dict[tuple[str, int], tuple[int, float]] = field(default_factory=dict)
    # (provider for a 401 / route for a 403, key) -> (status, set at)
    clears: dict[tuple[str, int], float] = field(default_factory=dict)  # (route, key) -> at
    usage: dict[tuple[str, int], Usage] = field(default_factory=dict)  # (provider, key) -> use
    # conversation -> (route, key, served at, prompt tokens, cache ttl): a conversation its
    # origin served on a key that is not the first of its key order (core/providers/affinity)
    moved: dict[int, Moved] = field(default_factory=dict)


def merged_stats(own: RouteStats | None, peers: list[RouteStats], now: float) -> RouteStats:
    """One route's statistics over this tracker and its peers."""
    every = ([own] if own is not None else []) + peers
    if not every:
        return RouteStats()
    ok = sum(s.ok for s in every)
    fail = sum(s.fail for s in every)

    def weighted(values: list[tuple[float | None, float]]) -> float | None:
        known = [(v, w) for v, w in values if v is not None]
        mass = sum(max(w, 1e-9) for _, w in known)
        return (sum(v * max(w, 1e-9) for v, w in known) / mass) if known else None

    tps = weighted([(s.tokens_per_s, s.ok) for s in every])
    ttfb = weighted([(s.ttfb_ms, s.ok) for s in every])
    penalty = max(s.penalty_now(now) for s in every)
    return RouteStats(ok, fail, tps, ttfb, penalty, now)


def _newer(state: PeerState, held: PeerState | None) -> bool:
    """Last writer wins by `t`; a tie goes to the greater representation, so any two
    trackers holding the same two reports keep the same one."""
    if held is None or state.t != held.t:
        return held is None or state.t > held.t
    return _canonical(state) > _canonical(held)


def _canonical(state: PeerState) -> str:
    """One text per report content, whatever order its maps were built in."""
    return repr([sorted(m.items()) for m in (state.stats, state.cooldowns, state.revoked,
                                             state.clears, state.usage, state.moved)])


@dataclass(slots=True)
class Merged:
    """What merging a message's reports did: taken, ignored (not newer), refused by reason."""

    applied: int = 0
    ignored: int = 0
    refused: dict[str, int] = field(default_factory=dict)

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1


class Peers:
    """Every other origin's newest report; what the gates and the scores read of them."""

    def __init__(self, ttl_s: float = REPORT_TTL_S) -> None:
        self.ttl_s = ttl_s
        self.states: dict[str, PeerState] = {}
        self._clears: dict[tuple[str, int], float] = {}  # of reports aged out (a max-register)

    def merge(self, origin: str, state: PeerState, now: float) -> bool:
        """Take `origin`'s report if newer than the one held (and not from the future)."""
        return self.merge_all({origin: state}, now, sender=origin).applied == 1

    def merge_all(self, reports: Mapping[str, PeerState], now: float, *, sender: str,
                  own: str = "", relay: bool = False) -> Merged:
        """Per-origin last-writer-wins over `reports` (the `sender`'s own and, with `relay`,
        those it relays); our `own` origin's is never taken from anyone."""
        out = Merged()
        for origin, state in reports.items():
            held = self.states.get(origin)
            if origin == own:
                out.refuse(OWN_ORIGIN)
            elif origin != sender and not relay:
                out.refuse(NOT_RELAYED)
            elif state.t > now + MAX_SKEW_S:
                out.refuse(FUTURE)
            elif state.t < now - self.ttl_s or not _newer(state, held):
                out.ignored += 1
            elif held is None and len(self.states) >= MAX_ORIGINS:
                out.refuse(STORE_FULL)
            else:
                self.states[origin] = state
                out.applied += 1
        return out

    def prune(self, now: float) -> list[str]:
        """Age out origins not refreshed for `ttl_s`; the origins dropped."""
        gone = [o for o, s in self.states.items() if s.t < now - self.ttl_s]
        for origin in gone:  # a clear outlives its report: what it lifted stays lifted
            for name, at in self.states.pop(origin).clears.items():
                self._clears[name] = max(at, self._clears.get(name, at))
        if len(self._clears) > MAX_CLEARS:
            kept = sorted(self._clears.items(), key=lambda item: item[1])[-MAX_CLEARS:]
            self._clears = dict(kept)
        return gone

    def stats(self, route: str) -> list[RouteStats]:
        return [s.stats[route] for s in self.states.values() if route in s.stats]

    def usage(self, provider: str, key: int, now: float) -> Usage:
        """The peers' use of a key: their minute while their report is under a minute old,
        their day while it is today (UTC)."""
        minute_r = minute_t = day_r = day_t = 0
        today = int(now // DAY_S)
        for state in self.states.values():
            used = state.usage.get((provider, key))
            if used is None:
                continue
            if now - state.t < MINUTE_S:
                minute_r += used.minute_requests
                minute_t += used.minute_tokens
            if used.day == today:
                day_r += used.day_requests
                day_t += used.day_tokens
        return Usage(minute_r, minute_t, today, day_r, day_t)

    def moved(self, conversation: int) -> Moved | None:
        """Where a peer served the conversation last off its key order's first key (the
        newest of the origins' reports); None when no peer did."""
        newest: Moved | None = None
        for state in self.states.values():
            told = state.moved.get(conversation)
            if told is not None and (newest is None or told[2] > newest[2]):
                newest = told
        return newest

    def cooldowns(self) -> dict[tuple[str, int], tuple[float, float]]:
        """Every peer's cooldown, the latest end per key (a max-register)."""
        out: dict[tuple[str, int], tuple[float, float]] = {}
        for state in self.states.values():
            for name, (until, at) in state.cooldowns.items():
                if until > out.get(name, (0.0, 0.0))[0]:
                    out[name] = (until, at)
        return out

    def clears(self) -> dict[tuple[str, int], float]:
        """The latest clear per (route, key) any origin reported."""
        out = dict(self._clears)
        for state in self.states.values():
            for name, at in state.clears.items():
                out[name] = max(at, out.get(name, at))
        return out
