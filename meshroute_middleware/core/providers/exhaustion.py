"""What a request that found no route is told: status, `Retry-After`, and why, route by route.

Status rule (issue 12): 503 when nothing is configured (or no node serves) for the model; 413
when the request is larger than every candidate's context; otherwise 429 whenever the chain holds
a provider route, whatever the failures were (as the seed does). A mesh-only chain answers 503
here and `mesh_only` tells the adapter to keep today's mesh answer instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from .chain import Resolution
from .keys import REASONS as GATE_REASONS

ATTEMPT_REASONS = ("http_429", "http_5xx", "timeout", "connect", "context", "http_401",
                   "http_403", "capability")  # capability: lacks what the request needs
REASONS = GATE_REASONS + ATTEMPT_REASONS
ERROR_CODE = "routes_exhausted"


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


@dataclass(frozen=True, slots=True)
class Exhaustion:
    """The answer to a request no route could take."""

    status: int
    message: str
    routes: tuple[PassedOver, ...]
    retry_after_s: int | None = None
    mesh_only: bool = False

    def headers(self) -> dict[str, str]:
        return {} if self.retry_after_s is None else {"Retry-After": str(self.retry_after_s)}

    def error_body(self) -> dict[str, Any]:
        kind = {429: "rate_limit_error", 413: "invalid_request_error"}.get(self.status,
                                                                          "server_error")
        return {"error": {"message": self.message, "type": kind, "code": ERROR_CODE,
                          "routes": [r.to_dict() for r in self.routes]}}


def exhaustion(resolution: Resolution, passed: Sequence[PassedOver], now: float) -> Exhaustion:
    """Build the exhaustion answer from every route passed over, in the order they were.

    A route key listed twice (a 429, then its cooldown when the loop came back for another key
    of the same route) keeps its first entry: what actually happened to it.
    """
    model = resolution.model
    firsts: dict[str, PassedOver] = {}
    for p in passed:
        firsts.setdefault(p.route, p)
    passed = list(firsts.values())
    if not resolution.candidates:
        return Exhaustion(503, f"no route is configured for model {model!r}", tuple(passed),
                          None, not resolution.has_provider)
    too_big = {_base(p.route) for p in passed if p.reason == "context"}
    if all(c.route in too_big for c in resolution.candidates):
        return Exhaustion(413, f"the request is larger than the context of every route for "
                               f"model {model!r}", tuple(passed))
    resets = [p.until for p in passed if p.until is not None and p.until > now]
    retry = max(1, math.ceil(min(resets) - now)) if resets else None
    tried = ", ".join(sorted({p.reason for p in passed})) or "no attempt"
    status = 429 if resolution.has_provider else 503
    return Exhaustion(status, f"every route for model {model!r} is exhausted ({tried})",
                      tuple(passed), retry, not resolution.has_provider)


def soonest_reset(passed: Sequence[PassedOver], now: float) -> float | None:
    """The earliest `until` still ahead (for `wait_for_key_s`): None when none is known."""
    resets = [p.until for p in passed if p.until is not None and p.until > now]
    return min(resets) if resets else None


def _base(route: str) -> str:
    """`fastco/big-model#2` → `fastco/big-model`."""
    head, sep, tail = route.rpartition("#")
    return head if sep and tail.isdigit() else route
