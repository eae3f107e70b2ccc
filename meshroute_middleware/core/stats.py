"""Decayed route statistics kept per origin tracker, so that gossip never double counts.

An entry is (value, mass, t): a decayed mean of tokens/s, its decayed sample weight and the time
of its last update, plus TTFB and decayed success/failure counts. A tracker writes only its own
origin's entries; a received entry replaces the stored one for its origin when it is newer
(last-writer-wins per origin). The routing view merges origins by decayed mass at read time.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import NamedTuple

from .contracts.limits import MAX_ERROR_CHARS
from .curves import Curve as Curve
from .curves import parse_curve as parse_curve
from .kinds import DECAYED, PROVEN, STALE, UNSAMPLED, Status

LN2 = math.log(2.0)
HALF_LIFE_S = 600.0  # ADR-0021 default
DECAYED_MASS = 0.5  # ADR-0021: "mass < 0.5 drops out of the exploit pool"
PRUNE_AFTER_S = 24 * 3600.0  # ADR-0021: "Routes with no samples for 24 h are pruned"
# Completion tokens an answer needs for its tokens/s to be a sample (ADR-0021
# MESHNET_ROUTE_MIN_SAMPLE_TOKENS): shorter answers are mostly time to first token.
MIN_SAMPLE_TOKENS = 8
MAX_NOTED_ORIGINS = 1024  # origins' change stamps kept per model (gossip's origins per route)


def decay_factor(dt_s: float, half_life_s: float) -> float:
    """0.5 ** (dt / half_life), never above 1 (a clock step backwards does not grow mass)."""
    if dt_s <= 0:
        return 1.0
    return math.exp(-LN2 * dt_s / half_life_s)


class StatEntry(NamedTuple):
    """One origin's decayed statistics of one route at time `t`.

    Immutable; a NamedTuple rather than a frozen dataclass because every recorded outcome
    builds one, and this is ~4x cheaper to construct.
    """

    value: float = 0.0  # decayed mean end-to-end tokens/s
    mass: float = 0.0  # decayed weight of the tps samples
    t: float = 0.0  # wall-clock time of the last update
    ttfb_s: float = 0.0  # decayed mean time to first byte, same weights as value
    ok: float = 0.0  # decayed successes
    fail: float = 0.0  # decayed failures
    count: int = 0  # type: ignore[assignment]  # tps samples ever taken into this entry
    last_error: str = ""
    # The origin's saturation curve as of `t` (None: none shared). Written by the origin with
    # the entry and replaced with it (last-writer-wins); masses decay like `mass`.
    curve: Curve | None = None

    def decayed(self, now: float, half_life_s: float) -> StatEntry:
        """The entry as seen at `now`: masses and counts decayed, t unchanged."""
        d = decay_factor(now - self.t, half_life_s)
        return StatEntry(self.value, self.mass * d, self.t, self.ttfb_s, self.ok * d,
                         self.fail * d, self.count, self.last_error, self.curve)

    def with_sample(self, tps: float, ttfb_s: float, now: float, half_life_s: float,
                    curve: Curve | None = None) -> StatEntry:
        """Add one successful tps sample: m' = m·d + 1, v' = (v·m·d + x) / m'; `curve`, when
        given, replaces the entry's curve summary."""
        d = decay_factor(now - self.t, half_life_s)
        md = self.mass * d
        mass = md + 1.0
        return StatEntry((self.value * md + tps) / mass, mass, max(now, self.t),
                         (self.ttfb_s * md + ttfb_s) / mass, self.ok * d + 1.0, self.fail * d,
                         self.count + 1, self.last_error, self.curve if curve is None else curve)

    def with_success(self, now: float, half_life_s: float) -> StatEntry:
        """A success that carries no tps sample (too few tokens)."""
        d = decay_factor(now - self.t, half_life_s)
        return StatEntry(self.value, self.mass * d, max(now, self.t), self.ttfb_s,
                         self.ok * d + 1.0, self.fail * d, self.count, self.last_error,
                         self.curve)

    def with_failure(self, error: str, now: float, half_life_s: float) -> StatEntry:
        """A failed request: a reliability sample, never a tps sample."""
        d = decay_factor(now - self.t, half_life_s)
        return StatEntry(self.value, self.mass * d, max(now, self.t), self.ttfb_s, self.ok * d,
                         self.fail * d + 1.0, self.count, error[:MAX_ERROR_CHARS], self.curve)

    def reset_tps(self) -> StatEntry:
        """Forget the tps part (measured under an older topology), its curve too; keep
        reliability."""
        return StatEntry(0.0, 0.0, self.t, 0.0, self.ok, self.fail, 0, self.last_error)


def newer(a: StatEntry, b: StatEntry) -> StatEntry:
    """Last-writer-wins with a total order on ties, so merging is commutative. The curve
    comes last: of two copies of one write, the one that kept its curve (one relayed by a
    tracker that does not know curves lost it) wins."""
    ka = (a.t, a.mass, a.value, a.count, a.ok, a.fail, a.ttfb_s, a.last_error, a.curve or ())
    kb = (b.t, b.mass, b.value, b.count, b.ok, b.fail, b.ttfb_s, b.last_error, b.curve or ())
    return a if ka >= kb else b


_EMPTY = StatEntry()


def measured_before(entry: StatEntry, changed_at: float) -> bool:
    """Whether an entry's tps was measured under an older topology (ADR-0021 "stale"): it
    holds samples and was last updated before the model's last topology change."""
    return bool(entry.count) and entry.t < changed_at


Cuts = tuple[float, ...]  # per entry, the change time it is judged against (`_cuts`)


def stale_route(entries: Iterable[StatEntry], changed_at: float, cuts: Cuts | None = None,
                ) -> bool:
    """The stale rule: no origin measured the route since the last topology change, and one
    measured it before (`measured_before`) with mass left. Its older speed is then a display
    prior only. `cuts`, when given, holds each entry's own change time (its origin's clock).
    (One pass, no generators: it runs for every route written since a decision.)"""
    before = False
    for i, e in enumerate(entries):
        if e.count:
            if e.t >= (changed_at if cuts is None else cuts[i]):
                return False  # measured since the change
            before = before or e.mass > 0
    return before


# A whole statistics state: (model, signature) -> origin -> entry.
State = dict[tuple[str, str], dict[str, StatEntry]]


class RouteView(NamedTuple):
    """The merged, decayed statistics of one route as a decision sees them.

    Immutable like a frozen dataclass, but a NamedTuple because a decision builds one per
    candidate and this is ~4x cheaper to construct (benchmarks/bench_core.py).
    """

    tps: float | None  # merged decayed mean tokens/s (fresh origins, else stale as prior)
    mass: float  # merged decayed mass of fresh origins
    ttfb_s: float | None
    ok: float
    fail: float
    count: int  # type: ignore[assignment]  # shadows tuple.count; the field name is API
    status: Status
    origins: int
    last_error: str = ""


UNSAMPLED_VIEW = RouteView(None, 0.0, None, 0.0, 0.0, 0, UNSAMPLED, 0)


def merge_view(entries: Iterable[StatEntry], now: float, changed_at: float,
               half_life_s: float, cuts: Cuts | None = None) -> RouteView:
    """Merge origins at `now`: decay each mass, v = Σ m·v / Σ m over the origins measured
    since the model's last topology change (each against its own cut when `cuts` is given);
    `stale_route` says when only older ones exist."""
    entries = entries if isinstance(entries, tuple) else tuple(entries)
    if not entries:
        return UNSAMPLED_VIEW
    fm = fv = ft = sm = sv = ok = fail = 0.0
    count = 0
    last_error, last_t = "", float("-inf")
    for i, e in enumerate(entries):
        d = decay_factor(now - e.t, half_life_s)
        ok += e.ok * d
        fail += e.fail * d
        m = e.mass * d
        if e.last_error and e.t > last_t:
            last_error, last_t = e.last_error, e.t
        if e.count == 0:
            continue
        if measured_before(e, changed_at if cuts is None else cuts[i]):
            sm += e.mass  # undecayed: a stale entry is only a display prior
            sv += e.mass * e.value
        else:
            fm += m
            fv += m * e.value
            ft += m * e.ttfb_s
            count += e.count
    origins = len(entries)
    if count:
        status: Status = PROVEN if fm >= DECAYED_MASS else DECAYED
        tps = fv / fm if fm > 0 else None
        ttfb = ft / fm if fm > 0 else None
        return RouteView(tps, fm, ttfb, ok, fail, count, status, origins, last_error)
    if stale_route(entries, changed_at, cuts):
        return RouteView(sv / sm, 0.0, None, ok, fail, 0, STALE, origins, last_error)
    return RouteView(None, 0.0, None, ok, fail, 0, UNSAMPLED, origins, last_error)


def merge_curves(entries: Iterable[StatEntry], now: float, changed_at: float,
                 half_life_s: float, cuts: Cuts | None = None) -> Curve:
    """The origins' curve summaries merged at `now` as their means are: per bin, each mass
    decayed to `now` (like the entry's), mean = Σ m·mean / Σ m, mass = Σ m. Only origins
    measured since the model's last topology change count; bins ascending, possibly more
    than MAX_CURVE_BINS (origins may have visited different concurrencies). `cuts`, when
    given, holds each entry's own change time, as in `stale_route`."""
    acc: dict[int, tuple[float, float]] = {}
    for i, e in enumerate(entries):
        if not e.curve or measured_before(e, changed_at if cuts is None else cuts[i]):
            continue
        d = decay_factor(now - e.t, half_life_s)
        for key, mass, mean in e.curve:
            m = mass * d
            total, weighted = acc.get(key, (0.0, 0.0))
            acc[key] = (total + m, weighted + m * mean)
    return tuple((key, total, weighted / total)
                 for key, (total, weighted) in sorted(acc.items()) if total > 0)


class MergedRoute:
    """The origins of one route merged once at their newest time `t_ref`.

    Every decayed mass shrinks by the same factor from `t_ref` on, so the merged tps and TTFB
    do not depend on `now` and a view at now >= t_ref costs one exponential instead of a merge
    over origins. A `now` before `t_ref` (clock skew) takes the exact merge. The merge itself
    waits for the first view: a route is re-merged after every write, and a decision often
    needs only `origins` and `stale`, which no merge is needed to tell.
    """

    __slots__ = ("_curve", "_ref", "changed_at", "cuts", "entries", "half_life_s", "origins",
                 "stale", "t_ref")

    def __init__(self, entries: tuple[StatEntry, ...], changed_at: float,
                 half_life_s: float, cuts: Cuts | None = None) -> None:
        self.entries = entries
        self.changed_at = changed_at
        self.cuts = cuts
        self.half_life_s = half_life_s
        self.origins = len(entries)
        self._ref: RouteView | None = None
        self._curve: Curve | None = None
        self.t_ref = max(e.t for e in entries)
        self.stale = stale_route(entries, changed_at, cuts)

    @property
    def ref(self) -> RouteView:
        """The merged view at `t_ref` (merged on first use)."""
        if self._ref is None:
            self._ref = merge_view(self.entries, self.t_ref, self.changed_at, self.half_life_s,
                                   self.cuts)
        return self._ref

    @property
    def curve(self) -> Curve:
        """The origins' curve summaries merged at `t_ref` (empty if none shares one; merged
        on first use). Later masses all shrink by one factor: the shape holds."""
        if self._curve is None:
            self._curve = merge_curves(self.entries, self.t_ref, self.changed_at,
                                       self.half_life_s, self.cuts)
        return self._curve

    def at(self, now: float) -> RouteView:
        """The merged view at `now`; equal to merge_view up to rounding."""
        if now < self.t_ref:
            return merge_view(self.entries, now, self.changed_at, self.half_life_s, self.cuts)
        ref = self.ref
        d = math.exp(-LN2 * (now - self.t_ref) / self.half_life_s)
        if ref.count:
            mass = ref.mass * d
            if mass > 0:
                status: Status = PROVEN if mass >= DECAYED_MASS else DECAYED
                return RouteView(ref.tps, mass, ref.ttfb_s, ref.ok * d, ref.fail * d,
                                 ref.count, status, ref.origins, ref.last_error)
            return RouteView(None, mass, None, ref.ok * d, ref.fail * d, ref.count, DECAYED,
                             ref.origins, ref.last_error)
        return RouteView(ref.tps, 0.0, None, ref.ok * d, ref.fail * d, 0, ref.status,
                         ref.origins, ref.last_error)


class RouteStatsStore:
    """Per (model, signature, origin) statistics; this tracker writes only `origin`."""

    def __init__(self, origin: str, half_life_s: float = HALF_LIFE_S,
                 prune_after_s: float = PRUNE_AFTER_S) -> None:
        self.origin = origin
        self.half_life_s = half_life_s
        self.prune_after_s = prune_after_s
        self._entries: State = {}
        self._merged: dict[tuple[str, str], MergedRoute] = {}  # cleared on every write
        # model -> origin -> (its stamp of the model's last change on its own clock, our
        # change time when its topology was found equal to ours, else None): `note_origin_change`
        self._origin_changes: dict[str, dict[str, tuple[float, float | None]]] = {}
        # routes written since a reader (the state file) last took this set; None: untracked
        self.changed: set[tuple[str, str]] | None = None

    def _own(self, model: str, signature: str, changed_at: float) -> StatEntry:
        origins = self._entries.get((model, signature))
        entry = origins.get(self.origin) if origins is not None else None
        if entry is None:
            return _EMPTY
        if measured_before(entry, changed_at):
            entry = entry.reset_tps()  # re-measured under the new topology
        return entry

    def _put(self, model: str, signature: str, entry: StatEntry) -> StatEntry:
        key = (model, signature)
        self._entries.setdefault(key, {})[self.origin] = entry
        self._merged.pop(key, None)
        if self.changed is not None:
            self.changed.add(key)
        return entry

    def record_sample(self, model: str, signature: str, tps: float, ttfb_s: float, now: float,
                      changed_at: float = float("-inf"), curve: Curve | None = None) -> StatEntry:
        """Take one successful tps sample into this origin's entry (and, when given, this
        origin's new curve summary of the route)."""
        entry = self._own(model, signature, changed_at)
        return self._put(model, signature,
                         entry.with_sample(tps, ttfb_s, now, self.half_life_s, curve))

    def record_success(self, model: str, signature: str, now: float,
                       changed_at: float = float("-inf")) -> StatEntry:
        """A success without a usable tps sample."""
        entry = self._own(model, signature, changed_at)
        return self._put(model, signature, entry.with_success(now, self.half_life_s))

    def record_failure(self, model: str, signature: str, error: str, now: float,
                       changed_at: float = float("-inf")) -> StatEntry:
        """A failure: counts against reliability only."""
        entry = self._own(model, signature, changed_at)
        return self._put(model, signature, entry.with_failure(error, now, self.half_life_s))

    def merged(self, model: str, signature: str,
               changed_at: float = float("-inf")) -> MergedRoute | None:
        """The origins of one route merged (once per write); None if it has no statistics."""
        return self.merged_many(model, (signature,), changed_at)[0]

    def merged_many(self, model: str, signatures: Iterable[str],
                    changed_at: float = float("-inf")) -> list[MergedRoute | None]:
        """`merged` for each of a model's routes (one call per decision, not per route)."""
        cache, entries, half_life_s = self._merged, self._entries, self.half_life_s
        out: list[MergedRoute | None] = []
        for signature in signatures:
            key = (model, signature)
            merged = cache.get(key)
            if merged is None or merged.changed_at != changed_at:
                origins = entries.get(key)
                if origins:
                    merged = cache[key] = MergedRoute(tuple(origins.values()), changed_at,
                                                      half_life_s,
                                                      self._cuts(model, origins, changed_at))
                else:
                    merged = None
            out.append(merged)
        return out

    def note_origin_change(self, model: str, origin: str, changed_at: float,
                           ours: float | None) -> bool:
        """Learn `origin`'s own stamp of `model`'s last topology change, on its own clock.
        `ours`: our change time when its topology equals ours (the same change, stamped on a
        skewed clock), else None. While our change time is still `ours`, that origin's entries
        are judged against its stamp, not ours, so clock skew never makes a sample taken after
        the change look older than it; otherwise against ours. An older stamp than the one held
        is ignored (gossip may reorder: the greatest (stamp, ours) wins, whatever the order).
        Return whether anything changed."""
        if origin == self.origin:
            return False
        held = self._origin_changes.setdefault(model, {})
        old = held.get(origin)
        if old is None and len(held) >= MAX_NOTED_ORIGINS:
            return False  # bounded: that origin's entries are judged against our change time
        rank = (changed_at, -math.inf if ours is None else ours)
        if old is not None and rank <= (old[0], -math.inf if old[1] is None else old[1]):
            return False
        held[origin] = (changed_at, ours)
        for key in [k for k in self._merged if k[0] == model]:
            del self._merged[key]
        return True

    def _cuts(self, model: str, origins: Mapping[str, StatEntry], changed_at: float,
              ) -> Cuts | None:
        """Per entry, the change time it is judged against: its origin's own stamp when that
        origin stamped the topology we have now, else ours (None: ours for all)."""
        held = self._origin_changes.get(model)
        if not held:
            return None
        cuts = []
        for origin in origins:
            stamp = held.get(origin)
            cuts.append(stamp[0] if stamp is not None and stamp[1] == changed_at else changed_at)
        return tuple(cuts)

    def entries(self, model: str, signature: str) -> dict[str, StatEntry]:
        """The raw per-origin entries of one route (a copy)."""
        return dict(self._entries.get((model, signature), {}))

    def state(self) -> State:
        """A copy of the whole state, for gossip."""
        return {k: dict(v) for k, v in self._entries.items()}

    def merge(self, other: Mapping[tuple[str, str], Mapping[str, StatEntry]],
              now: float | None = None) -> int:
        """Merge a received state; entries of our own origin are ours alone, entries older
        than the prune horizon are not resurrected. Return how many entries changed."""
        cutoff = float("-inf") if now is None else now - self.prune_after_s
        changed = 0
        for key, origins in other.items():
            mine = self._entries.setdefault(key, {})
            for origin, entry in origins.items():
                if origin == self.origin or entry.t < cutoff:
                    continue
                have = mine.get(origin)
                best = entry if have is None else newer(have, entry)
                if best is not have:
                    mine[origin] = best
                    self._merged.pop(key, None)
                    changed += 1
                    if self.changed is not None:
                        self.changed.add(key)
            if not mine:
                del self._entries[key]
        return changed

    def prune(self, now: float) -> int:
        """Drop entries not updated for `prune_after_s`; return how many went."""
        cutoff = now - self.prune_after_s
        dropped = 0
        for key in list(self._entries):
            origins = self._entries[key]
            for origin in [o for o, e in origins.items() if e.t < cutoff]:
                del origins[origin]
                self._merged.pop(key, None)
                dropped += 1
            if not origins:
                del self._entries[key]
        return dropped

    def __iter__(self) -> Iterator[tuple[tuple[str, str], dict[str, StatEntry]]]:
        return iter(self._entries.items())

    def restore(self, saved: Mapping[tuple[str, str], Mapping[str, StatEntry]],
                now: float) -> int:
        """Take back a state this tracker saved itself (its state file): `merge`, except that
        entries of our own origin are taken too (newer wins). Return how many changed."""
        changed = self.merge(saved, now)
        cutoff = now - self.prune_after_s
        for (model, signature), origins in saved.items():
            entry = origins.get(self.origin)
            if entry is None or entry.t < cutoff:
                continue
            have = self._entries.get((model, signature), {}).get(self.origin)
            if have is None or (have != entry and newer(have, entry) is entry):
                self._put(model, signature, entry)
                changed += 1
        return changed
