"""Counting windows of the gates (core/providers/keys.py's provider keys and
core/clients_budget.py's clients): sliding minutes in 1-second buckets, the UTC day, the UTC
calendar month.

- rpm and tpm are SLIDING 60-second windows kept in 1-second buckets: an event leaves the
  window up to one second late, never early (so a limit is never passed, and the state stays
  <= 61 buckets whatever the rate).
- rpd and tpd are FIXED windows: counters of the current UTC day, reset at 00:00 UTC.
- Reservations in flight count until settled, or INFLIGHT_TTL_S at most (a lost task).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import UTC, datetime

MINUTE_S = 60.0
DAY_S = 86_400.0
INFLIGHT_TTL_S = 900.0  # a reservation never settled (a lost task) stops counting after this


@dataclass(slots=True)
class Window:
    """Rate-limit counters of one provider key."""

    requests: dict[int, int] = field(default_factory=dict)  # second -> requests sent in it
    tokens: dict[int, int] = field(default_factory=dict)  # second -> tokens settled in it
    day: int = -1  # UTC day number the day counters belong to
    day_requests: int = 0
    day_tokens: int = 0
    inflight: dict[int, tuple[int, float]] = field(default_factory=dict)  # id -> (tokens, at)
    rolled: int = -1  # the second of the last roll

    def roll(self, now: float) -> bool:
        """Drop what left the minute, reservations past INFLIGHT_TTL_S, and a past day's
        counts; once per second (buckets and days change on whole seconds; a reservation
        then expires up to a second late, never early). Whether it rolled (False: already
        rolled in this second)."""
        second = int(now // 1)
        if second == self.rolled:
            return False
        self.rolled = second
        for buckets in (self.requests, self.tokens):  # oldest first: seconds come in order
            while buckets:
                first = next(iter(buckets))
                if first + 1 + MINUTE_S > now:  # leaves(first), inline: rolled per request
                    break
                del buckets[first]
        while self.inflight:  # oldest first: reservation ids grow with time
            oldest = next(iter(self.inflight))
            if self.inflight[oldest][1] + INFLIGHT_TTL_S > now:
                break
            del self.inflight[oldest]
        day = int(now // DAY_S)
        if day != self.day:
            self.day, self.day_requests, self.day_tokens = day, 0, 0
        return True


def leaves(second: int) -> float:
    """When the events of a 1-second bucket leave the sliding minute (its end + 60 s)."""
    return second + 1 + MINUTE_S


def frees(buckets: dict[int, int], pending: int, limit: int) -> float | None:
    """When enough of the minute's events leave for `pending` more to fit under `limit`."""
    if pending > limit:
        return None  # in-flight work (or the request itself) is over the limit alone
    excess = sum(buckets.values()) + pending - limit
    for second in sorted(buckets):
        excess -= buckets[second]
        if excess <= 0:
            return leaves(second)
    return None


def month_index(now: float) -> int:
    return _month_of_hour(int(now // 3600))


@functools.lru_cache(maxsize=8)
def _month_of_hour(hour: int) -> int:
    """Months start on an hour boundary in UTC, so the hour number decides the month."""
    moment = datetime.fromtimestamp(hour * 3600, UTC)
    return moment.year * 12 + moment.month - 1


def month_start(index: int) -> float:
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC).timestamp()
