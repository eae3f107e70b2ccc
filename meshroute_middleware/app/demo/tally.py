"""What the demo's clients saw, and what always choosing the true best route would have given.

The comparison covers the mesh models' requests; the provider chain's (`auto`) are counted on
their own (ChainCounts): who served them, and the 429s the gateway absorbed.

Per request: delivered tokens/s = tokens ÷ the request's wall time at the client (gateway,
forwarding and time to first byte included). The yardstick: the same tokens on the route that
was truly best at that moment, at the emulator's idle speed (no queueing, no overhead), and on
the route the router really chose at the same idle speed — so the summary separates how well
the router chose from what serving costs. A conversation's turn counts like any request; the
yardstick leaves its prefill out (what even the best route pays for the turn's new tokens),
so a cold turn shows as serving cost, and the returning turns' warm share is counted apart.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from meshroute_middleware.app.demo.providers import ChainCounts
from meshroute_middleware.core.contracts.cache import CacheNote

# How a request's prompt fared in the head node's prefix cache, as the last-requests list
# shows it: a conversation's returning turn should be warm.
MARKS = {"warm": "● warm", "partial": "◐ partial", "cold": "○ cold"}


@dataclass
class Tally:
    """Counters of the demo's traffic and its timeline of mesh events."""

    started: float = field(default_factory=time.monotonic)
    ok: int = 0
    failed: int = 0
    tokens: int = 0
    busy_s: float = 0.0  # Σ wall time of the successful requests
    best_s: float = 0.0  # Σ their tokens ÷ the true best route's tok/s at the time
    chosen_s: float = 0.0  # Σ their tokens ÷ the chosen route's true tok/s
    compared_tokens: int = 0  # Σ their tokens
    recent: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=1000))
    last: deque[str] = field(default_factory=lambda: deque(maxlen=6))
    events: list[tuple[float, str]] = field(default_factory=list)
    best_tps: dict[str, float] = field(default_factory=dict)  # model -> true best now
    chain: ChainCounts | None = None  # the provider chain's requests, when it runs
    turns: int = 0  # answered turns 2+ of conversations (counted in the delivered speed too)
    warm_turns: int = 0  # of which the head node found the prefix warm
    cache: dict[str, int] = field(default_factory=dict)  # cache state -> answered requests

    def elapsed_s(self) -> float:
        """Seconds since the traffic started."""
        return time.monotonic() - self.started

    def served(self, model: str, tokens: int, wall_s: float, chosen_tps: float) -> None:
        """A request that delivered `tokens` in `wall_s` over a route truly doing chosen_tps."""
        self.ok += 1
        self.tokens += tokens
        self.recent.append((time.monotonic(), tokens))
        best = self.best_tps.get(model, 0.0)
        if best > 0 and chosen_tps > 0 and wall_s > 0:
            self.busy_s += wall_s
            self.best_s += tokens / best
            self.chosen_s += tokens / chosen_tps
            self.compared_tokens += tokens

    def noted(self, note: CacheNote | None, returning: bool) -> str:
        """Count a served request's cache note (`returning`: a conversation's turn 2+);
        return its marker for the last-requests list ("" when the node sent none)."""
        if note is None:
            return ""
        self.cache[note.state] = self.cache.get(note.state, 0) + 1
        if returning:
            self.turns += 1
            self.warm_turns += note.state == "warm"
        return MARKS.get(note.state, "")

    def event(self, text: str) -> str:
        """Add a timeline entry; return it as shown."""
        line = f"t+{self.elapsed_s():3.0f}s  {text}"
        self.events.append((time.monotonic(), line))
        return line

    def tokens_per_s(self, window_s: float = 10.0) -> float:
        """Delivered tokens/s of all clients together over the last `window_s` seconds."""
        now = time.monotonic()
        toks = sum(n for t, n in self.recent if now - t <= window_s)
        return toks / min(window_s, max(now - self.started, 1e-3))

    def per_request_tps(self) -> tuple[float, float, float]:
        """(delivered, true best, chosen at idle speed) tokens/s per request, token-weighted."""
        if self.compared_tokens <= 0:
            return 0.0, 0.0, 0.0
        n = self.compared_tokens
        return n / self.busy_s, n / self.best_s, n / self.chosen_s

    def summary(self) -> str:
        """The last line: requests, failures, delivered against the true best route."""
        delivered, best, chosen = self.per_request_tps()
        text = (f"summary: {self.ok + self.failed} requests in {self.elapsed_s():.0f}s, "
                f"{self.failed} failed; delivered {delivered:.1f} tok/s per request")
        if best > 0:
            text += (f" vs {best:.1f} always on the true best route ({delivered / best:.0%}; "
                     f"the routes chosen run at {chosen / best:.0%} of the best)")
        if self.turns:
            text += (f"; {self.turns} returning conversation turns, "
                     f"{self.warm_turns / self.turns:.0%} warm")
        if self.chain is not None:
            text += f"; {self.chain.summary()}"
        return text
