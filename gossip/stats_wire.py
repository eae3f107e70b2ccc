"""Route statistics on the wire: DIGEST and DELTA bodies, encoded and strictly decoded.

Entries travel nested as {model: {signature: {origin: leaf}}}; an entry's leaf is
`[value, mass, t, ttfb_s, ok, fail, count, last_error]`, a digest's `[t, fingerprint]`.
A statistics entry, digest version or change time whose values are out of range refuses only
that item, counted in `Message.refused` under `invalid_entry`. `sendable` applies the very same
entry check before an entry is put on the wire, so a peer never refuses what we send.

An entry's saturation-curve summary (issue 14) travels beside the entries, in the delta body's
optional map `k` ({model: {signature: {origin: [[bin, mass, mean log tps], ...]}}}), so a
version 2 decoder that predates it ignores it (a body's unknown keys are skipped) and still
takes the entry, whose 8-field leaf is unchanged: no version bump. A curve is checked as
strictly as an entry (`core.curves.parse_curve`, the state file's check too: at most
`MAX_CURVE_BINS` bins, strictly ascending in 0..`MAX_CURVE_BIN`, masses finite and >= 0, means
finite and within the log of the tokens/s bounds); a bad one, or one naming no entry of the
delta, refuses its entry too, counted in `Message.refused_curves` (`invalid_curve`). We only
put on the wire curves that pass the check.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from meshroute_middleware.core.contracts.limits import (
    MAX_ERROR_CHARS,
    MAX_ID_CHARS,
    MAX_SIGNATURE_CHARS,
    MAX_TPS,
)
from meshroute_middleware.core.curves import Curve, parse_curve
from meshroute_middleware.core.stats import StatEntry

from . import errors as err
from . import state as st
from .checks import (
    MAX_COUNT,
    MAX_MASS,
    MAX_TTFB_S,
    Refused,
    as_map,
    fail,
    integer,
    number,
    text,
)

INVALID_ENTRY = "invalid_entry"  # counter label of an item refused for its values
INVALID_CURVE = "invalid_curve"  # an entry refused for its curve summary's values

T = TypeVar("T")


# -- encoding ---------------------------------------------------------------------------------

def _nest(flat: Mapping[st.EntryKey, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for (model, sig, origin), value in flat.items():
        out.setdefault(model, {}).setdefault(sig, {})[origin] = value
    return out


def digest_obj(digest: st.Digest) -> dict[str, Any]:
    """The plain form of a DIGEST body."""
    versions = {k: [float(t), fp] for k, (t, fp) in digest.versions.items()}
    return {"v": _nest(versions), "c": dict(digest.changes), "f": dict(digest.shapes)}


def _entry_obj(e: StatEntry) -> list[Any]:
    return [e.value, e.mass, e.t, e.ttfb_s, e.ok, e.fail, e.count, e.last_error]


def _curve_obj(curve: Curve) -> list[list[Any]]:
    return [[key, mass, mean] for key, mass, mean in curve]


def delta_obj(body: st.Delta) -> dict[str, Any]:
    """The plain form of a DELTA body (curves only those a peer accepts)."""
    entries = {k: _entry_obj(e) for k, e in body.entries.items()}
    curves = {k: _curve_obj(e.curve) for k, e in body.entries.items()
              if e.curve and curve_sendable(e.curve)}
    digest = None if body.digest is None else digest_obj(body.digest)
    obj = {"e": _nest(entries), "c": dict(body.changes), "d": digest, "f": dict(body.shapes)}
    if curves:  # only then: a delta without curves is byte for byte what it was
        obj["k"] = _nest(curves)
    return obj


# -- decoding ---------------------------------------------------------------------------------

def _walk(obj: Any, what: str) -> list[tuple[st.EntryKey, Any]]:
    """Flatten {model: {signature: {origin: leaf}}} with every key checked."""
    out: list[tuple[st.EntryKey, Any]] = []
    for model, sigs in as_map(obj, what).items():
        text(model, "model", MAX_ID_CHARS)
        for sig, origins in as_map(sigs, what).items():
            text(sig, "signature", MAX_SIGNATURE_CHARS)
            for origin, leaf in as_map(origins, what).items():
                out.append(((model, sig, text(origin, "origin", MAX_ID_CHARS)), leaf))
    return out


def _changes(obj: Any, refused: Refused) -> dict[str, float]:
    """Topology change times per model ("c")."""
    return _per_model(as_map(obj, "changes"), lambda t: number(t, "changed_at", -math.inf),
                      refused)


def _shapes(obj: Any, refused: Refused) -> dict[str, int]:
    """Topology fingerprints per model ("f", optional: a peer that sends none is treated as
    having another topology than ours)."""
    if obj is None:
        return {}
    return _per_model(as_map(obj, "shapes"), lambda f: integer(f, "shape", 2**32 - 1), refused)


def _per_model(items: dict[Any, Any], leaf: Callable[[Any], T],
               refused: Refused) -> dict[str, T]:
    """{model: value} with every model id checked; a bad value is refused alone (counted)."""
    if len(items) > st.MAX_MODELS_PER_MESSAGE:
        raise fail("too many models")
    out: dict[str, T] = {}
    for model, value in items.items():
        text(model, "model", MAX_ID_CHARS)
        try:
            out[model] = leaf(value)
        except err.MalformedMessage:
            refused.n += 1
    return out


def _version(leaf: Any) -> st.Version:
    if not isinstance(leaf, list) or len(leaf) != 2:
        raise fail("a version must be [t, fingerprint]")
    return (number(leaf[0], "t", -math.inf), integer(leaf[1], "fingerprint", 2**32 - 1))


def _entry(leaf: Any) -> StatEntry:
    if not isinstance(leaf, list) or len(leaf) != 8:
        raise fail("an entry must be [value, mass, t, ttfb_s, ok, fail, count, last_error]")
    value = number(leaf[0], "value", 0.0, MAX_TPS)
    mass, ok, failed = (number(x, "mass", 0.0, MAX_MASS) for x in (leaf[1], leaf[4], leaf[5]))
    t, ttfb = number(leaf[2], "t"), number(leaf[3], "ttfb_s", 0.0, MAX_TTFB_S)
    error = leaf[7]
    if not isinstance(error, str) or len(error) > MAX_ERROR_CHARS or not error.isprintable():
        raise fail("last_error must be a string")
    return StatEntry(value, mass, t, ttfb, ok, failed, integer(leaf[6], "count", MAX_COUNT),
                     error)


def _curve(leaf: Any) -> Curve:
    try:
        return parse_curve(leaf)  # the one check, shared with the state file
    except ValueError as exc:
        raise fail(str(exc)) from exc


def _with_curves(entries: dict[st.EntryKey, StatEntry], obj: Any,
                 refused: Refused) -> dict[st.EntryKey, StatEntry]:
    """Attach each curve to its entry; a bad curve drops its entry, a curve without an
    entry is dropped, both counted in `refused.curves`."""
    if obj is None:
        return entries
    pairs = _walk(obj, "curves")
    _bounded(pairs, st.MAX_ENTRIES_PER_MESSAGE)
    for key, leaf in pairs:
        entry = entries.get(key)
        try:
            curve = _curve(leaf)
        except err.MalformedMessage:
            curve = None
        if entry is None or curve is None:
            refused.curves += 1
            entries.pop(key, None)
        else:
            entries[key] = entry._replace(curve=curve)
    return entries


def _bounded(pairs: list[tuple[st.EntryKey, Any]], max_entries: int) -> None:
    if len(pairs) > max_entries:
        raise fail(f"more than {max_entries} entries")
    if len({k[2] for k, _ in pairs}) > st.MAX_ORIGINS_PER_MESSAGE:
        raise fail(f"more than {st.MAX_ORIGINS_PER_MESSAGE} origins")


def _each(pairs: list[tuple[st.EntryKey, Any]], parse: Any,
          refused: Refused) -> dict[st.EntryKey, Any]:
    """Parse every leaf; a leaf with a bad value is dropped and counted, the rest kept."""
    out: dict[st.EntryKey, Any] = {}
    for key, leaf in pairs:
        try:
            out[key] = parse(leaf)
        except err.MalformedMessage:
            refused.n += 1
    return out


def read_digest(obj: Any, refused: Refused) -> st.Digest:
    """A DIGEST body from its plain form, every field checked."""
    body = as_map(obj, "digest")
    pairs = _walk(body.get("v"), "versions")
    _bounded(pairs, st.MAX_DIGEST_ENTRIES)
    return st.Digest(_each(pairs, _version, refused), _changes(body.get("c"), refused),
                     _shapes(body.get("f"), refused))


def read_delta(obj: Any, refused: Refused) -> st.Delta:
    """A DELTA body from its plain form, every field checked."""
    body = as_map(obj, "delta")
    pairs = _walk(body.get("e"), "entries")
    _bounded(pairs, st.MAX_ENTRIES_PER_MESSAGE)
    digest = None if body.get("d") is None else read_digest(body.get("d"), refused)
    entries = _with_curves(_each(pairs, _entry, refused), body.get("k"), refused)
    return st.Delta(entries, _changes(body.get("c"), refused), digest,
                    _shapes(body.get("f"), refused))


def sendable(entry: StatEntry) -> bool:
    """Whether a peer's decoder would accept this entry (the same check, on our side)."""
    try:
        _entry(_entry_obj(entry))
    except err.MalformedMessage:
        return False
    return True


def curve_sendable(curve: Curve) -> bool:
    """Whether a peer's decoder would accept this curve summary (the same check)."""
    try:
        _curve(_curve_obj(curve))
    except err.MalformedMessage:
        return False
    return True
