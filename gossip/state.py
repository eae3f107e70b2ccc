"""What a tracker gossips, pure: per-origin route statistics and per-model topology change times.

A digest names every (model, signature, origin) entry a tracker holds with its version (the
entry's `t` and a fingerprint of its contents); a delta carries the entries a peer lacks or holds
older. Applying a delta is the core's last-writer-wins merge per origin (`RouteStatsStore.merge`),
so duplicated, reordered or lost messages never double count. Nothing here does I/O.

Who may speak for an origin (docs/security.md, "Gossip"): a delta's entries for the sender's own
origin are always taken; entries for any other origin (relayed, gossip's transitivity) only when
the frame was authenticated with the shared secret (`relay=True`). Without a secret nothing
authenticates the relayer, so a stranger could otherwise inject any tracker's statistics; direct
gossip still converges because every tracker gossips with every peer it knows. Each refusal is
per entry and counted by reason (`ApplyResult.refused`); the other entries of the delta still
apply. Timestamps past `now + MAX_SKEW_S` are refused, entries and topology change times alike;
an accepted change time is clamped to `now`, so a peer whose clock runs ahead never marks our
fresh samples stale. The store is bounded per origin and as a whole.

Clock skew (docs/reliability.md): every tracker stamps a topology change on its own clock, and
its samples too. A change time travels with a fingerprint of the topology it led to; a peer
whose fingerprint equals ours saw the same change, so its (skewed) stamp is not adopted as a
new change, and its own entries are judged against its own stamp, on the clock they were
measured with (`RouteStatsStore.note_origin_change`). A peer with another topology saw a change
we have not: its time is adopted (clamped) and its entries are judged against our change time.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from meshroute_middleware.core.defaults import MAX_SKEW_S
from meshroute_middleware.core.stats import RouteStatsStore, StatEntry
from meshroute_middleware.core.topology import Topology

# (model, signature, origin): one origin tracker's entry for one route.
EntryKey = tuple[str, str, str]
# (t, fingerprint): orders entries of one key; equal t with a different fingerprint means the
# two trackers hold different entries and both must be exchanged (the core's `newer` decides).
Version = tuple[float, int]

MAX_ENTRIES_PER_MESSAGE = 1024  # delta bound: ~150 B an entry keeps a delta under ~160 KiB
MAX_DIGEST_ENTRIES = 16_384  # digest bound: ~30 B an entry keeps a digest under ~0.5 MiB
MAX_ORIGINS_PER_MESSAGE = 512  # distinct origin trackers one message may speak for
MAX_MODELS_PER_MESSAGE = 256  # topology change times one message may carry
MAX_ORIGINS_PER_ROUTE = 1024  # origins a store keeps for one route; more are refused
MAX_STORE_ENTRIES = 65_536  # (route, origin) entries a store takes from gossip (~10 MB at most)
MAX_ENTRIES_PER_ORIGIN = 4096  # routes one origin may fill in our store (one delta holds 1024)

# Reasons an entry or change time is refused, the counter labels.
FOREIGN_ORIGIN = "foreign_origin"  # another origin's entry from an unauthenticated sender
FUTURE = "future"  # dated past now + MAX_SKEW_S
FUTURE_CHANGE = "future_change"  # a topology change time past now + MAX_SKEW_S
ORIGIN_FULL = "origin_full"  # MAX_ENTRIES_PER_ORIGIN reached for that origin
ROUTE_FULL = "route_full"  # MAX_ORIGINS_PER_ROUTE reached for that route
STORE_FULL = "store_full"  # MAX_STORE_ENTRIES reached


@dataclass(frozen=True, slots=True)
class Digest:
    """The versions of every entry a tracker holds, and its models' topology change times."""

    versions: dict[EntryKey, Version] = field(default_factory=dict)
    changes: dict[str, float] = field(default_factory=dict)
    shapes: dict[str, int] = field(default_factory=dict)  # model -> `topology_shape`


@dataclass(frozen=True, slots=True)
class Delta:
    """Entries a peer lacks or holds older; optionally the sender's digest to ask for a push."""

    entries: dict[EntryKey, StatEntry] = field(default_factory=dict)
    changes: dict[str, float] = field(default_factory=dict)
    digest: Digest | None = None
    shapes: dict[str, int] = field(default_factory=dict)  # model -> `topology_shape`


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What applying one delta did, by outcome."""

    applied: int = 0  # entries that replaced or added an origin's entry
    ignored: int = 0  # own origin, not newer, or older than the prune horizon
    changes: int = 0  # topology change times adopted (known models only)
    refused: dict[str, int] = field(default_factory=dict)  # refused entries by reason

    def count(self, reason: str) -> int:
        """How many entries were refused for `reason`."""
        return self.refused.get(reason, 0)


def fingerprint(entry: StatEntry) -> int:
    """A 32-bit fingerprint of an entry's contents, the same in every process; an entry's
    curve summary counts when it has one (so two copies of one write that differ only in
    their curve are exchanged and converge), and an entry without one fingerprints as
    before curves existed. Cost: a tracker that predates curves holds its copy without the
    curve, so it and a newer peer re-send that entry each round until it is upgraded."""
    fields = (entry.value, entry.mass, entry.t, entry.ttfb_s, entry.ok, entry.fail,
              entry.count, entry.last_error)
    text = repr(fields if entry.curve is None else (*fields, entry.curve))
    return zlib.crc32(text.encode())


def version(entry: StatEntry) -> Version:
    """The version a digest advertises for an entry."""
    return (entry.t, fingerprint(entry))


def flat_entries(store: RouteStatsStore) -> dict[EntryKey, StatEntry]:
    """Every (model, signature, origin) entry of a store, all origins (gossip is transitive)."""
    return {(model, sig, origin): entry
            for (model, sig), origins in store for origin, entry in origins.items()}


def topology_changes(topology: Topology) -> dict[str, float]:
    """Per model, the wall-clock time of its last known topology change (finite ones only)."""
    out: dict[str, float] = {}
    for name in topology.models():
        model = topology.model(name)
        if model is not None and math.isfinite(model.changed_at):
            out[name] = model.changed_at
    return out


def topology_shape(topology: Topology, model: str) -> int | None:
    """A 32-bit fingerprint of what a change of `model`'s topology changes (each node's id,
    layers and URL; not its load), the same in every process; None for an unknown model."""
    topo = topology.model(model)
    if topo is None:
        return None
    nodes = sorted((n.node_id, n.start, n.end, n.layers, n.url) for n in topo.nodes.values())
    return zlib.crc32(repr(nodes).encode())


def _shapes(topology: Topology, models: Iterable[str]) -> dict[str, int]:
    return {m: s for m in models if (s := topology_shape(topology, m)) is not None}


def _newest_first(entries: Mapping[EntryKey, StatEntry]) -> list[EntryKey]:
    return sorted(entries, key=lambda k: (-entries[k].t, k))


def make_digest(store: RouteStatsStore, topology: Topology) -> Digest:
    """This tracker's digest: newest entries first up to MAX_DIGEST_ENTRIES."""
    entries = flat_entries(store)
    keys = _newest_first(entries)[:MAX_DIGEST_ENTRIES]
    changes = _capped(topology_changes(topology))
    return Digest({k: version(entries[k]) for k in keys}, changes, _shapes(topology, changes))


def _capped(changes: Mapping[str, float]) -> dict[str, float]:
    newest = sorted(changes, key=lambda m: (-changes[m], m))[:MAX_MODELS_PER_MESSAGE]
    return {m: changes[m] for m in newest}


def _wanted(mine: Version, theirs: Version | None) -> bool:
    """Whether a peer advertising `theirs` lacks our entry or holds an older or different one."""
    if theirs is None:
        return True
    return mine[0] > theirs[0] or (mine[0] == theirs[0] and mine[1] != theirs[1])


def make_delta(store: RouteStatsStore, topology: Topology, peer: Digest, *,
               sendable: Callable[[StatEntry], bool], relay: bool,
               include_digest: bool = False) -> Delta:
    """What the peer behind `peer` lacks: entries and newer topology change times, bounded by
    MAX_ENTRIES_PER_MESSAGE and MAX_ORIGINS_PER_MESSAGE (newest first; the rest next round).

    Never puts on the wire what the peer would refuse: only entries `sendable` accepts (the
    codec's range check), and other origins' entries only when `relay` (authenticated gossip).
    """
    entries = flat_entries(store)
    chosen: dict[EntryKey, StatEntry] = {}
    origins: set[str] = set()
    for key in _newest_first(entries):
        if len(chosen) >= MAX_ENTRIES_PER_MESSAGE:
            break
        if not relay and key[2] != store.origin:
            continue
        if not _wanted(version(entries[key]), peer.versions.get(key)):
            continue
        if key[2] not in origins and len(origins) >= MAX_ORIGINS_PER_MESSAGE:
            continue
        if not sendable(entries[key]):
            continue
        origins.add(key[2])
        chosen[key] = entries[key]
    ours = topology_changes(topology)
    changes = {m: t for m, t in ours.items() if t > peer.changes.get(m, -math.inf)}
    digest = make_digest(store, topology) if include_digest else None
    changes = _capped(changes)
    return Delta(chosen, changes, digest, _shapes(topology, changes))


def apply_delta(store: RouteStatsStore, topology: Topology, delta: Delta, now: float, *,
                sender: str, relay: bool) -> ApplyResult:
    """Merge a received delta from tracker `sender` into the store, entry by entry, and adopt
    newer topology change times; refused entries are counted by reason, the rest apply."""
    applied = ignored = 0
    refused: dict[str, int] = {}
    horizon = now + MAX_SKEW_S
    per_origin: dict[str, int] = {}
    for _, known_origins in store:
        for origin in known_origins:
            per_origin[origin] = per_origin.get(origin, 0) + 1
    size = sum(per_origin.values())
    for (model, sig, origin), entry in delta.entries.items():
        known = store.entries(model, sig)
        reason = _refusal(origin, entry, known, sender=sender, relay=relay, horizon=horizon,
                          size=size, held=per_origin.get(origin, 0))
        if reason is not None:
            refused[reason] = refused.get(reason, 0) + 1
        elif store.merge({(model, sig): {origin: entry}}, now):
            applied += 1
            if origin not in known:
                size += 1
                per_origin[origin] = per_origin.get(origin, 0) + 1
        else:
            ignored += 1
    changes = _apply_changes(store, topology, delta.changes, delta.shapes, now, refused,
                             sender=sender)
    return ApplyResult(applied, ignored, changes, refused)


def _refusal(origin: str, entry: StatEntry, known: Mapping[str, StatEntry], *, sender: str,
             relay: bool, horizon: float, size: int, held: int) -> str | None:
    """Why one received entry is refused, or None to merge it."""
    if origin != sender and not relay:
        return FOREIGN_ORIGIN
    if entry.t > horizon:
        return FUTURE
    if origin in known:
        return None  # an update never grows the store
    if len(known) >= MAX_ORIGINS_PER_ROUTE:
        return ROUTE_FULL
    if held >= MAX_ENTRIES_PER_ORIGIN:
        return ORIGIN_FULL
    if size >= MAX_STORE_ENTRIES:
        return STORE_FULL
    return None


def note_changes(store: RouteStatsStore, topology: Topology, changes: Mapping[str, float],
                 shapes: Mapping[str, int], now: float, *, sender: str) -> list[str]:
    """Record the sender's own stamps of its known models' last changes (from its digest or
    delta); return the models whose topology differs from ours (or is not told), so a newer
    change time of theirs is a change we have not seen. Stamps past the skew are skipped."""
    differ = []
    for model, changed_at in changes.items():
        current = topology.model(model)  # unknown models are not noted: no unbounded growth
        if current is None or changed_at > now + MAX_SKEW_S:
            continue
        same = shapes.get(model) == topology_shape(topology, model)
        store.note_origin_change(model, sender, changed_at, current.changed_at if same else None)
        if not same:
            differ.append(model)
    return differ


def _apply_changes(store: RouteStatsStore, topology: Topology, changes: Mapping[str, float],
                   shapes: Mapping[str, int], now: float, refused: dict[str, int], *,
                   sender: str) -> int:
    """Adopt newer change times of known models whose topology differs from ours (the same
    topology stamped later is the same change on a skewed clock); past the skew refused, else
    clamped to now."""
    adopted = 0
    differ = note_changes(store, topology, changes, shapes, now, sender=sender)
    for model, changed_at in changes.items():
        if changed_at > now + MAX_SKEW_S:
            refused[FUTURE_CHANGE] = refused.get(FUTURE_CHANGE, 0) + 1
            continue
        changed_at = min(changed_at, now)
        current = topology.model(model)
        if model in differ and current is not None and changed_at > current.changed_at:
            topology.note_change(model, changed_at)
            adopted += 1
    return adopted
