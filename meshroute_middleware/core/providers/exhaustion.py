"""What a request that found no route is told: status, `Retry-After`, and why, route by route.

The status rule (issue 24), one for every path (`exhaustion_status`: the provider chain here,
the mesh path's `chat.attempts.Attempts.exhausted`, the mitmproxy addon through it):
- 429 when any route was passed over for a limit, a cooldown, a budget or an upstream 429: the
  client should wait (`Retry-After`: the soonest known reset);
- otherwise 502 `upstream_failed` when routes were tried and failed upstream (5xx, connect,
  timeout, a broken stream, a key refused with 401/403, or a key revoked by such a refusal
  earlier: the same answer as the request that met the refusal, so a client sees one status
  for one state of the gateway);
- otherwise 503: nothing is configured, no route exists, or none could be tried.
The provider chain answers 413 before this rule when the request is larger than every
candidate's context, and each path 504 when the request's deadline ran out first. Every path
lists the routes the same way: `[{"route", "reason", "until"}]` (`PassedOver`), the codes come
from http/errors.py's table.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..contracts.retry_text import retry_text
from .chain import Resolution
from .keys import REASONS as GATE_REASONS

# capability: lacks what the request needs; upstream_invalid: an answer that cannot be read
# (a body that is not what its headers say, or not the API's JSON); stream, redirect,
# app_error: the mesh path's error kinds (core/kinds.py)
ATTEMPT_REASONS = ("http_429", "http_5xx", "timeout", "connect", "context", "http_401",
                   "http_403", "capability", "upstream_invalid", "stream", "redirect",
                   "app_error")
REASONS = GATE_REASONS + ATTEMPT_REASONS
# Reasons by what they tell the client. LIMITED: wait and retry (429). UPSTREAM: the routes
# were tried and failed, or their keys were refused (502); the mesh path's error kinds
# (core/kinds.py) are included. `context` and `client_error` are neither: a route too small
# for the request, or the request's own fault.
LIMITED = frozenset({"cooldown", "rpm", "rpd", "tpm", "tpd", "budget", "http_429"})
KEY_REFUSED = frozenset({"revoked", "http_401", "http_403"})
UPSTREAM = KEY_REFUSED | {"http_5xx", "timeout", "connect", "stream", "redirect", "app_error",
                          "upstream_invalid"}


@dataclass(frozen=True, slots=True)
class PassedOver:
    """One route (a route key, `fastco/big-model#2`, or a mesh model) and why it was skipped."""

    route: str
    reason: str
    until: float | None = None  # unix time the reason ends, where known

    def __post_init__(self) -> None:
        if self.reason not in REASONS:
            raise ValueError(f"unknown pass-over reason {self.reason!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"route": self.route, "reason": self.reason, "until": self.until}


def attempt_reason(status: int | None = None, error: str | None = None) -> str:
    """The reason for a failed attempt: an upstream status (401 and 403 refuse the key),
    or `timeout` / `connect`."""
    if status in (401, 403, 429):
        return f"http_{status}"
    if status is not None and status >= 500:
        return "http_5xx"
    if error in ("timeout", "connect", "context"):
        return error
    raise ValueError(f"not a route failure: status={status!r} error={error!r}")


def exhaustion_status(reasons: Iterable[str]) -> int:
    """The one status rule of a request no route answered: 429 when any route was passed
    over for a limit, a cooldown, a budget or a 429; else 502 when any failed upstream (or
    its key was refused); else 503."""
    seen = set(reasons)
    if seen & LIMITED:
        return 429
    return 502 if seen & UPSTREAM else 503


def exhaustion_message(model: str, reasons: Iterable[str]) -> str:
    """What the client is told of an exhausted request, by the rule's cause."""
    seen = set(reasons)
    listed = ", ".join(sorted(seen)) or "no attempt"
    status = exhaustion_status(seen)
    if status == 502 and not seen & (UPSTREAM - KEY_REFUSED):
        return (f"the provider refused every key tried for model {model!r} ({listed}): "
                "fix the keys, then POST /v1/cooldowns/clear")
    if status == 502:
        return f"every route tried for model {model!r} failed upstream ({listed})"
    if status == 429:
        return (f"every route for model {model!r} is rate limited, cooling down or out of "
                f"budget for now ({listed})")
    return f"no route for model {model!r} could be tried ({listed})"


@dataclass(frozen=True, slots=True)
class Exhaustion:
    """The answer to a request no route could take (its code: http/errors.py's table)."""

    status: int
    message: str
    routes: tuple[PassedOver, ...]
    retry_after_s: int | None = None

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}


def exhaustion(resolution: Resolution, passed: Sequence[PassedOver], now: float) -> Exhaustion:
    """Build the exhaustion answer from every route passed over, in the order they were.

    A route key listed twice (a 429, then its cooldown when the loop came back for another key
    of the same route) keeps its first entry: what actually happened to it.
    """
    model = resolution.model
    passed = firsts(passed)
    if not resolution.candidates:
        return Exhaustion(503, f"no route is configured for model {model!r}", tuple(passed))
    too_big = {_base(p.route) for p in passed if p.reason == "context"}
    if all(c.route in too_big for c in resolution.candidates):
        return Exhaustion(413, f"the request is larger than the context of every route for "
                               f"model {model!r}", tuple(passed))
    return by_rule(model, passed, now)


def by_rule(model: str, passed: Sequence[PassedOver], now: float) -> Exhaustion:
    """The status rule's answer (429, 502 or 503) for routes passed over in this order (the
    mesh path's exhaustion, and the chain's once 413 and 503 "none configured" are ruled
    out)."""
    passed = firsts(passed)
    reasons = [p.reason for p in passed]
    status = exhaustion_status(reasons)
    retry = retry_after_s((p.until for p in passed), now) if status == 429 else None
    message = exhaustion_message(model, reasons)
    if retry is not None:
        message += f"; {retry_text(now + retry, now)}"
    return Exhaustion(status, message, tuple(passed), retry)


def firsts(passed: Sequence[PassedOver]) -> list[PassedOver]:
    """Each route once, at its first entry, in order."""
    seen: dict[str, PassedOver] = {}
    for p in passed:
        seen.setdefault(p.route, p)
    return list(seen.values())


def retry_after_s(untils: Iterable[float | None], now: float) -> int | None:
    """A 429's `Retry-After`: whole seconds (rounded up, at least 1) until the soonest known
    reset still ahead, on every path (the client may retry once any route may be free)."""
    resets = [u for u in untils if u is not None and u > now]
    return max(1, math.ceil(min(resets) - now)) if resets else None


def soonest_reset(passed: Sequence[PassedOver], now: float) -> float | None:
    """The earliest `until` still ahead (for `wait_for_key_s`): None when none is known."""
    resets = [p.until for p in passed if p.until is not None and p.until > now]
    return min(resets) if resets else None


def _base(route: str) -> str:
    """`fastco/big-model#2` → `fastco/big-model`."""
    head, sep, tail = route.rpartition("#")
    return head if sep and tail.isdigit() else route
