"""When to come back, as a client reads it (issue 33): "retry after 2026-12-05T00:00:00Z
(8 h 49 min)" rather than a count of seconds. The `Retry-After` header stays in seconds, as
HTTP says (RFC 9110 §10.2.3); this is the message's wording."""

from __future__ import annotations

import math
from datetime import UTC, datetime


def retry_text(until: float, now: float) -> str:
    """`retry after <UTC time, ISO 8601, whole seconds> (<how long from now>)`."""
    at = datetime.fromtimestamp(math.ceil(until), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"retry after {at} ({span_text(until - now)})"


def span_text(seconds: float) -> str:
    """A wait in the two largest units that say it: `42 s`, `3 min 5 s`, `8 h 49 min`,
    `2 d 3 h` (rounded up to the smallest unit shown, at least 1 s)."""
    left = max(1, math.ceil(seconds))
    if left < 60:
        return f"{left} s"
    if left < 3600:
        return _two(left, 60, "min", "s")
    if left < 86400:
        return _two(math.ceil(left / 60), 60, "h", "min")
    return _two(math.ceil(left / 3600), 24, "d", "h")


def _two(count: int, per: int, big: str, small: str) -> str:
    high, low = divmod(count, per)
    return f"{high} {big}" if low == 0 else f"{high} {big} {low} {small}"
