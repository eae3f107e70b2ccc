"""An engine's decode speed and prefix-cache hit rate from its cumulative counters, each over
a window big enough to mean something (issue 31).

Engines export what they did as counters that only grow: generated tokens and the seconds
spent generating them (llama.cpp `tokens_predicted_total` / `tokens_predicted_seconds_total`;
vLLM and SGLang a seconds-per-token histogram's `_count` / `_sum`), prompt tokens queried
and found in the prefix cache. The node announces figures from the differences between
reads, with three rules:

- a window closes only once it holds enough work: llama.cpp times an answer's first token
  with the prompt, so one `max_tokens: 1` answer reads as 1 token in 1 µs (1,000,000 tok/s);
  a window needs a second of decoding, which no run of such answers adds up to, and a read
  holding only such answers (faster than any engine decodes) is left out of it;
- a counter that goes backwards is a restart: the window is dropped and the new process's
  counters (which started at 0) open the next one; never a negative rate. The speed keeps
  its last figure (the same machine); the hit rate is dropped (the new process's cache is
  empty);
- a window with nothing in it (idle) keeps the last good figure rather than inventing one.

A hit-rate window whose prompts found nothing cached says the prompts were new, not that
caching is off (a conversation's first turns are always cold): it changes nothing. Pure:
counters in, the figure out; node_agent/load.py feeds each read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Final, NamedTuple

# A speed window's least decode work. 1 s of summed per-request decode time: a one-token
# answer adds 1 µs, so no run of them fills it. 32 tokens: one answer's first token (timed in
# the prompt by llama.cpp) then overstates its speed by at most 32/31 (3 %).
MIN_WINDOW_TOKENS: Final = 32.0
MIN_WINDOW_S: Final = 1.0
# A read whose tokens came faster than this is not decoding but answers of one token (which
# llama.cpp times at 1 µs each): it is left out of the window. Above any engine's speed for
# one request today (hundreds to ~2,000 tok/s).
MAX_DECODE_TOKENS_PER_S: Final = 10_000.0
# A hit-rate window's least prompt tokens queried: a few prompts' worth, not one short one.
MIN_CACHE_WINDOW_TOKENS: Final = 512.0


class Counters(NamedTuple):
    """Two cumulative counts read together: (tokens, seconds) of decoding, or (hits,
    queries) of the prefix cache, in prompt tokens."""

    part: float
    whole: float


def _counts(counters: Counters) -> Counters:
    """`counters`, or ValueError for counts no engine writes (negative, not finite)."""
    part, whole = counters
    if not (math.isfinite(part) and math.isfinite(whole)) or part < 0 or whole < 0:
        raise ValueError(f"counters {part!r} / {whole!r} are not counts")
    return counters


@dataclass(slots=True)
class _Window:
    """The differences of successive `Counters` summed until the window holds enough."""

    min_part: float
    min_whole: float
    restarts: int = 0  # counters seen going backwards
    _last: Counters | None = None
    _part: float = 0.0
    _whole: float = 0.0

    def _fold(self, counters: Counters) -> Counters | None:
        """Add one read; the window's sums when it closes (then it starts again), else None."""
        part, whole = _counts(counters)
        last = self._last or Counters(0.0, 0.0)  # the first read: the whole history
        if part < last.part or whole < last.whole:
            self.restarts += 1
            self._part = self._whole = 0.0
            last = Counters(0.0, 0.0)
            self._restarted()
        self._last = counters
        self._part += part - last.part
        self._whole += whole - last.whole
        if self._part < self.min_part or self._whole < self.min_whole:
            return None
        closed = Counters(self._part, self._whole)
        self._part = self._whole = 0.0
        return closed

    def _restarted(self) -> None:
        """What a restart does to the figure beyond dropping the window: nothing here."""


@dataclass(slots=True)
class SpeedWindow(_Window):
    """Tokens/s of one request from (tokens, seconds) counters; None until a window closed."""

    min_part: float = MIN_WINDOW_TOKENS
    min_whole: float = MIN_WINDOW_S
    tokens_per_s: float | None = None  # the last closed window's figure

    def add(self, counters: Counters) -> float | None:
        """Fold one read in; the figure to announce."""
        last, counters = self._last or Counters(0.0, 0.0), _counts(counters)
        if counters.part >= last.part and counters.whole >= last.whole \
                and counters.part - last.part > MAX_DECODE_TOKENS_PER_S * (
                    counters.whole - last.whole):
            self._last = counters  # one-token answers only since the last read
            return self.tokens_per_s
        closed = self._fold(counters)
        if closed is not None:
            self.tokens_per_s = closed.part / closed.whole
        return self.tokens_per_s


@dataclass(slots=True)
class HitWindow(_Window):
    """The share of queried prompt tokens found cached, from (hits, queries) counters; None
    until a window with hits closed."""

    min_part: float = 0.0
    min_whole: float = MIN_CACHE_WINDOW_TOKENS
    hit_rate: float | None = None  # the last closed window's figure that had hits

    def _restarted(self) -> None:
        self.hit_rate = None  # a new process starts with an empty cache: the old rate is gone

    def add(self, counters: Counters) -> float | None:
        """Fold one read in; the figure to announce. ValueError for hits above queries."""
        if counters.part > counters.whole:
            raise ValueError(f"{counters.part:g} hits above {counters.whole:g} queries")
        closed = self._fold(counters)
        if closed is not None and closed.part > 0:
            self.hit_rate = min(closed.part / closed.whole, 1.0)
        return self.hit_rate
