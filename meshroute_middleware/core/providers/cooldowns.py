"""Cooldowns of a provider key on one model after a 429: the provider's Retry-After, else an
escalating ladder, and the month's token budget counted beside them (one row per route key,
`keys` in the shared store)."""

from __future__ import annotations

from dataclasses import dataclass
from email.utils import parsedate_to_datetime

from .windows import month_index

# Escalating cooldowns after repeated 429s that carry no Retry-After. The ceiling is 30 minutes:
# users of the reference saw whole key pools benched for 24 h by one bad hour.
COOLDOWN_LADDER_S = (30.0, 120.0, 600.0, 1800.0)
RETRY_AFTER_MAX_S = 3600.0  # a Retry-After is obeyed up to an hour; longer is capped (hostile)
LADDER_RESET_S = 3600.0  # an hour without a 429 and the ladder starts again at its first step


@dataclass(slots=True)
class KeyRoute:
    """Cooldown, 429 ladder and monthly budget of one key on one model."""

    cooldown_until: float = 0.0
    strikes: int = 0  # 429s in a row (without a success or an hour's quiet in between)
    last_429_at: float = 0.0
    month: int = -1  # year * 12 + month - 1, UTC
    month_tokens: int = 0

    def roll(self, now: float) -> None:
        month = month_index(now)
        if month != self.month:
            self.month, self.month_tokens = month, 0


def cool_down(state: KeyRoute, retry_after_s: float | None, now: float) -> float:
    """A 429 at `now`: `state` cools down (Retry-After, capped, else the ladder's next step,
    which starts again after an hour's quiet); when the cooldown ends."""
    if now - state.last_429_at > LADDER_RESET_S:
        state.strikes = 0
    state.strikes += 1
    state.last_429_at = now
    if retry_after_s is not None:
        wait = min(max(retry_after_s, 0.0), RETRY_AFTER_MAX_S)
    else:
        wait = COOLDOWN_LADDER_S[min(state.strikes, len(COOLDOWN_LADDER_S)) - 1]
    state.cooldown_until = max(state.cooldown_until, now + wait)
    return state.cooldown_until


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date); None if unusable."""
    if not value:
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(text).timestamp() - now
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    if seconds != seconds or seconds < 0:
        return None
    return min(seconds, RETRY_AFTER_MAX_S)
