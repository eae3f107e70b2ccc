"""Provider reports on the wire (issue 23): PROVIDERS and PROVIDER_REPORTS bodies.

A report is `{"t", "s", "c", "r", "x", "u", "a"}`: its time, route statistics, and cooldowns,
revocations, clears and usage as {name: {"key position": leaf}} maps, and the conversations it
served off their key order's first key (provider-key affinity, issue 35) as {"conversation":
[route, key, served at, prompt tokens, cache ttl]}, every leaf checked (a peer that predates
"a" ignores it).
PROVIDER_REPORTS carries every origin's newest report the sender holds, versioned on its own
(`REPORTS_VERSION`); a bad origin's report is dropped alone and counted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from meshroute_middleware.core.contracts.limits import MAX_ID_CHARS, MAX_TPS
from meshroute_middleware.core.providers.peers import Moved, PeerState, Usage
from meshroute_middleware.core.providers.scoring import PENALTY_CAP, RouteStats

from . import errors as err
from .checks import (
    MAX_COUNT,
    MAX_MASS,
    MAX_TTFB_S,
    Refused,
    as_map,
    fail,
    integer,
    is_int,
    number,
    text,
)

MAX_REPORT_NAMES = 256  # routes or providers one report may name
MAX_REPORT_KEYS = 1024  # key positions under one name
MAX_TTFB_MS = MAX_TTFB_S * 1000
REPORTS_VERSION = 1  # PROVIDER_REPORTS body shape; another value is refused whole
MAX_REPORT_ORIGINS = 64  # origins one PROVIDER_REPORTS message may carry
MAX_REPORT_ITEMS = 8_192  # statistics, cooldowns, revocations, clears and usage, all origins
MAX_REPORT_MOVED = 1024  # moved conversations one report may carry (affinity.MAX_MOVED)
MAX_TTL_S = 7 * 86_400.0  # a cache_ttl beyond a week is no provider's

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Reports:
    """Provider reports by origin (the sender's own among them), newest the sender holds."""

    by_origin: dict[str, PeerState] = field(default_factory=dict)


# -- encoding ---------------------------------------------------------------------------------

def _by_key(items: Mapping[tuple[str, int], Any]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for (name, key), leaf in items.items():
        out.setdefault(name, {})[str(key)] = leaf
    return out


def report_obj(r: PeerState) -> dict[str, Any]:
    """The plain form of one origin's report (a PROVIDERS body); "a" only when it has moved
    conversations (a report without is byte for byte what it was before them)."""
    obj: dict[str, Any] = {
        "t": r.t,
        "s": {n: [s.ok, s.fail, s.tokens_per_s, s.ttfb_ms, s.penalty, s.penalty_at]
              for n, s in r.stats.items()},
        "c": _by_key({k: list(v) for k, v in r.cooldowns.items()}),
        "r": _by_key({k: list(v) for k, v in r.revoked.items()}),
        "x": _by_key(dict(r.clears)),
        "u": _by_key({k: list(v) for k, v in r.usage.items()})}
    if r.moved:
        obj["a"] = {str(c): list(m) for c, m in r.moved.items()}
    return obj


def reports_obj(body: Reports) -> dict[str, Any]:
    """The plain form of a PROVIDER_REPORTS body."""
    return {"v": REPORTS_VERSION, "o": {o: report_obj(r) for o, r in body.by_origin.items()}}


# -- decoding ---------------------------------------------------------------------------------

def _keyed(obj: Any, what: str, leaf: Callable[[Any], T],
           low_key: int = 1) -> dict[tuple[str, int], T]:
    names = as_map(obj, what)
    if len(names) > MAX_REPORT_NAMES:
        raise fail(f"more than {MAX_REPORT_NAMES} names in {what}")
    out: dict[tuple[str, int], T] = {}
    for name, keys in names.items():
        text(name, what, MAX_ID_CHARS)
        keys = as_map(keys, what)
        if len(keys) > MAX_REPORT_KEYS:
            raise fail(f"more than {MAX_REPORT_KEYS} keys in {what}")
        for key, value in keys.items():
            if not isinstance(key, str) or not key.isascii() or not key.isdigit() \
                    or len(key) > 4 or not (
                    low_key <= int(key) <= MAX_REPORT_KEYS):
                raise fail(f"{what}: a key position must be {low_key}..{MAX_REPORT_KEYS}")
            out[(name, int(key))] = leaf(value)
    return out


def _pair(leaf: Any, what: str) -> list[Any]:
    if not isinstance(leaf, list) or len(leaf) != 2:
        raise fail(f"{what} must be [value, set at]")
    return leaf


def _cooldown(leaf: Any) -> tuple[float, float]:
    until, at = _pair(leaf, "a cooldown")
    return number(until, "until", -math.inf), number(at, "set at", -math.inf)


def _revocation(leaf: Any) -> tuple[int, float]:
    status, at = _pair(leaf, "a revocation")
    if status not in (401, 403) or not is_int(status):
        raise fail("a revocation's status must be 401 or 403")
    return int(status), number(at, "set at", -math.inf)


def _usage(leaf: Any) -> Usage:
    if not isinstance(leaf, list) or len(leaf) != 5:
        raise fail("usage must be [minute requests, minute tokens, day, day requests, "
                   "day tokens]")
    minute_r, minute_t, day_r, day_t = (integer(x, "usage", MAX_COUNT)
                                        for x in (leaf[0], leaf[1], leaf[3], leaf[4]))
    if not is_int(leaf[2]) or not -1 <= leaf[2] <= 10**7:
        raise fail("usage day must be a UTC day number")
    return Usage(minute_r, minute_t, int(leaf[2]), day_r, day_t)


def _stats(leaf: Any) -> RouteStats:
    if not isinstance(leaf, list) or len(leaf) != 6:
        raise fail("route statistics must be [ok, fail, tps, ttfb_ms, penalty, penalty_at]")
    ok, failed = (number(x, "count", 0.0, MAX_MASS) for x in leaf[:2])
    tps = None if leaf[2] is None else number(leaf[2], "tokens_per_s", 0.0, MAX_TPS)
    ttfb = None if leaf[3] is None else number(leaf[3], "ttfb_ms", 0.0, MAX_TTFB_MS)
    return RouteStats(ok, failed, tps, ttfb, number(leaf[4], "penalty", 0.0, PENALTY_CAP),
                      number(leaf[5], "penalty_at", -math.inf))


def _moved(obj: Any, t: float) -> dict[int, Moved]:
    """The moved conversations of a report made at `t`: none served after it."""
    moved = as_map(obj, "moved conversations")
    if len(moved) > MAX_REPORT_MOVED:
        raise fail(f"more than {MAX_REPORT_MOVED} moved conversations")
    out: dict[int, Moved] = {}
    for conversation, leaf in moved.items():
        if not isinstance(conversation, str) or not conversation.isascii() \
                or not conversation.isdigit() \
                or len(conversation) > 20 or int(conversation) >= 2**64:
            raise fail("a conversation must be a 64-bit number")
        if not isinstance(leaf, list) or len(leaf) != 5:
            raise fail("a moved conversation must be [route, key, at, tokens, ttl]")
        key = integer(leaf[1], "key position", MAX_REPORT_KEYS)
        if key < 1:
            raise fail(f"a key position must be 1..{MAX_REPORT_KEYS}")
        out[int(conversation)] = (text(leaf[0], "route", MAX_ID_CHARS), key,
                                  number(leaf[2], "served at", -math.inf, t),
                                  integer(leaf[3], "prompt tokens", MAX_COUNT),
                                  number(leaf[4], "cache ttl", 0.0, MAX_TTL_S))
    return out


def read_report(obj: Any) -> PeerState:
    """One origin's report from its plain form, every leaf checked (MalformedMessage)."""
    body = as_map(obj, "report")
    names = as_map(body.get("s", {}), "statistics")
    if len(names) > MAX_REPORT_NAMES:
        raise fail(f"more than {MAX_REPORT_NAMES} routes in statistics")
    stats = {text(n, "route", MAX_ID_CHARS): _stats(v) for n, v in names.items()}
    t = number(body.get("t"), "t", -math.inf)
    return PeerState(t, stats,
                     _keyed(body.get("c", {}), "cooldowns", _cooldown),
                     _keyed(body.get("r", {}), "revocations", _revocation),
                     _keyed(body.get("x", {}), "clears",
                            lambda at: number(at, "cleared at", -math.inf), low_key=0),
                     _keyed(body.get("u", {}), "usage", _usage), _moved(body.get("a", {}), t))


def report_items(r: PeerState) -> int:
    """How many items a report carries (what MAX_REPORT_ITEMS bounds)."""
    return (len(r.stats) + len(r.cooldowns) + len(r.revoked) + len(r.clears) + len(r.usage)
            + len(r.moved))


def read_reports(obj: Any, refused: Refused) -> Reports:
    """Every origin's report, each checked on its own: a bad one is dropped and counted."""
    body = as_map(obj, "reports")
    version = body.get("v")
    if not is_int(version) or version != REPORTS_VERSION:
        raise err.UnsupportedVersion(f"provider reports version {version!r}, we speak "
                                     f"{REPORTS_VERSION}")
    origins = as_map(body.get("o"), "reports")
    if len(origins) > MAX_REPORT_ORIGINS:
        raise err.OversizedMessage(f"more than {MAX_REPORT_ORIGINS} origins in reports")
    out: dict[str, PeerState] = {}
    items = 0
    for origin, leaf in origins.items():
        name = text(origin, "origin", MAX_ID_CHARS)
        try:
            report = read_report(leaf)
        except err.MalformedMessage:
            refused.n += 1
            continue
        items += report_items(report)
        if items > MAX_REPORT_ITEMS:
            raise err.OversizedMessage(f"more than {MAX_REPORT_ITEMS} items in reports")
        out[name] = report
    return Reports(out)


def bounded_reports(own: str, mine: PeerState, others: Mapping[str, PeerState]) -> Reports:
    """What a tracker sends: its own report, then the newest others' while they fit the
    caps (the rest go to whichever peer relays them next)."""
    out, items = {own: mine}, report_items(mine)
    for origin, report in sorted(others.items(), key=lambda o: -o[1].t):
        if len(out) >= MAX_REPORT_ORIGINS or items + report_items(report) > MAX_REPORT_ITEMS:
            continue
        out[origin] = report
        items += report_items(report)
    return Reports(out)
