"""What a tracker gossips, pure: per-origin route statistics and per-model topology change times.

A digest names every (model, signature, origin) entry a tracker holds with its version (the
entry's `t` and a fingerprint of its contents); a delta carries the entries a peer lacks or holds
older. Applying a delta is the core's last-writer-wins merge per origin (`RouteStatsStore.merge`),
so duplicated, reordered or lost messages never double count. Nothing here does I/O.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

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
MAX_FUTURE_S = 300.0  # an entry dated this far past our clock is a broken clock or a lie


@dataclass(frozen=True, slots=True)
class Digest:
    """The versions of every entry a tracker holds, and its models' topology change times."""

    versions: dict[EntryKey, Version] = field(default_factory=dict)
    changes: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Delta:
    """Entries a peer lacks or holds older; optionally the sender's digest to ask for a push."""

    entries: dict[EntryKey, StatEntry] = field(default_factory=dict)
    changes: dict[str, float] = field(default_factory=dict)
    digest: Digest | None = None


@dataclass(frozen=True, slots=True)
class ApplyResult:
    """What applying one delta did, by outcome."""

    applied: int = 0  # entries that replaced or added an origin's entry
    ignored: int = 0  # own origin, not newer, or older than the prune horizon
    future: int = 0  # refused: dated more than MAX_FUTURE_S past our clock
    over_cap: int = 0  # refused: MAX_ORIGINS_PER_ROUTE or MAX_STORE_ENTRIES reached
    changes: int = 0  # topology change times adopted (known models only)


def fingerprint(entry: StatEntry) -> int:
    """A 32-bit fingerprint of an entry's contents, the same in every process."""
    text = repr((entry.value, entry.mass, entry.t, entry.ttfb_s, entry.ok, entry.fail,
                 entry.count, entry.last_error))
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


def _newest_first(entries: Mapping[EntryKey, StatEntry]) -> list[EntryKey]:
    return sorted(entries, key=lambda k: (-entries[k].t, k))


def make_digest(store: RouteStatsStore, topology: Topology) -> Digest:
    """This tracker's digest: newest entries first up to MAX_DIGEST_ENTRIES."""
    entries = flat_entries(store)
    keys = _newest_first(entries)[:MAX_DIGEST_ENTRIES]
    return Digest({k: version(entries[k]) for k in keys}, _capped(topology_changes(topology)))


def _capped(changes: Mapping[str, float]) -> dict[str, float]:
    newest = sorted(changes, key=lambda m: (-changes[m], m))[:MAX_MODELS_PER_MESSAGE]
    return {m: changes[m] for m in newest}


def _wanted(mine: Version, theirs: Version | None) -> bool:
    """Whether a peer advertising `theirs` lacks our entry or holds an older or different one."""
    if theirs is None:
        return True
    return mine[0] > theirs[0] or (mine[0] == theirs[0] and mine[1] != theirs[1])


def make_delta(store: RouteStatsStore, topology: Topology, peer: Digest,
               include_digest: bool = False) -> Delta:
    """What the peer behind `peer` lacks: entries and newer topology change times, bounded by
    MAX_ENTRIES_PER_MESSAGE and MAX_ORIGINS_PER_MESSAGE (newest first; the rest next round)."""
    entries = flat_entries(store)
    chosen: dict[EntryKey, StatEntry] = {}
    origins: set[str] = set()
    for key in _newest_first(entries):
        if len(chosen) >= MAX_ENTRIES_PER_MESSAGE:
            break
        if not _wanted(version(entries[key]), peer.versions.get(key)):
            continue
        if key[2] not in origins and len(origins) >= MAX_ORIGINS_PER_MESSAGE:
            continue
        origins.add(key[2])
        chosen[key] = entries[key]
    ours = topology_changes(topology)
    changes = {m: t for m, t in ours.items() if t > peer.changes.get(m, -math.inf)}
    digest = make_digest(store, topology) if include_digest else None
    return Delta(chosen, _capped(changes), digest)


def apply_delta(store: RouteStatsStore, topology: Topology, delta: Delta,
                now: float) -> ApplyResult:
    """Merge a received delta into the store and adopt newer topology change times."""
    applied = ignored = future = over_cap = 0
    horizon = now + MAX_FUTURE_S
    size = sum(len(origins) for _, origins in store)
    for (model, sig, origin), entry in delta.entries.items():
        if entry.t > horizon:
            future += 1
            continue
        known = store.entries(model, sig)
        if origin not in known and (len(known) >= MAX_ORIGINS_PER_ROUTE
                                    or size >= MAX_STORE_ENTRIES):
            over_cap += 1
            continue
        if store.merge({(model, sig): {origin: entry}}, now):
            applied += 1
            size += 0 if origin in known else 1
        else:
            ignored += 1
    changes = _apply_changes(topology, delta.changes.items(), horizon)
    return ApplyResult(applied, ignored, future, over_cap, changes)


def _apply_changes(topology: Topology, changes: Iterable[tuple[str, float]],
                   horizon: float) -> int:
    adopted = 0
    for model, changed_at in changes:
        if changed_at > horizon:
            continue
        current = topology.model(model)  # unknown models are not adopted: no unbounded growth
        if current is not None and changed_at > current.changed_at:
            topology.note_change(model, changed_at)
            adopted += 1
    return adopted
