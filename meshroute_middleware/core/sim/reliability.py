"""Reliability scenarios (issue 34): what a slow first byte, a stream dying mid-way or a
stream falling silent costs a client under each way of answering them, as decisions the
simulator scores.

Requests come one after another over routes that serve the same model (each request starts
on the next route in turn, its fallbacks the ones after). Each attempt draws its time to
first byte (log-normal noise; a share of them `tail_factor` × slower), its speed, and
whether its stream breaks or falls silent before its end. A policy decides what the gateway
does about it, with the gateway's own rules: a learned first-byte deadline and gap
(core/learned.py), a hedge after a quantile of the route's learned first-byte times capped
by core/hedging.HedgeCap (and a hedge without its own first byte by its route's delay gets
the route after it, up to core/hedging.MAX_RACERS racing), a stream continued on the next
route after a break (mid-stream failover), or, as the peers' clients do, the whole request
sent again. Pure and seeded: one `random.Random` per run, no clock.
"""

from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass, field

from ..hedging import DEFAULT_MAX_SHARE, MAX_RACERS, HedgeAfter, HedgeCap
from ..learned import MIN_SAMPLES, WINDOW, learned_s, quantile


@dataclass(frozen=True, slots=True)
class SimRoute:
    """One route: its usual first byte, its tail, its speed and how its streams fail."""

    name: str
    ttfb_s: float = 0.02
    tps: float = 50.0
    tail_share: float = 0.0  # of attempts whose first byte is `tail_factor` × later
    tail_factor: float = 100.0
    breaks_share: float = 0.0  # of streams whose connection drops before their end
    stalls_share: float = 0.0  # of streams that fall silent before their end (a hang)


@dataclass(frozen=True, slots=True)
class ReliabilityScenario:
    name: str
    description: str
    routes: tuple[SimRoute, ...]
    requests: int = 2000
    tokens: tuple[int, int] = (64, 512)  # each answer's length, uniform
    noise_sigma: float = 0.2  # log-normal noise of first bytes and speeds


@dataclass(frozen=True, slots=True)
class Policy:
    """What the gateway does about late first bytes and broken or silent streams."""

    name: str
    learned: bool = False  # first-byte deadline and gap learned per route (else the timeouts)
    learned_gap: bool = True  # with `learned`: the gap too (False: provider streams before
    # issue 34's provider gap, the idle timeout between chunks)
    hedge: HedgeAfter | None = None
    max_share: float = DEFAULT_MAX_SHARE
    racers: int = MAX_RACERS  # routes racing at most (2: one hedge per request)
    on_break: str = "error"  # "error": the client gets the partial answer and an error;
    # "continue": the next route continues it (mid-stream failover); "retry": the client
    # sends the whole request again (what the peers' SDKs do)
    first_byte_timeout_s: float = 60.0
    idle_timeout_s: float = 30.0


POLICIES: tuple[Policy, ...] = (
    Policy("timeouts only (peers)", on_break="retry"),
    Policy("learned deadlines", learned=True),
    Policy("learned first byte, idle-timeout gap", learned=True, learned_gap=False),
    Policy("learned + hedge p95", learned=True, hedge=HedgeAfter(quantile=0.95)),
    Policy("learned + hedge p95, cap 15 %", learned=True, hedge=HedgeAfter(quantile=0.95),
           max_share=0.15),
    Policy("learned + hedge p80, cap 15 %", learned=True, hedge=HedgeAfter(quantile=0.8),
           max_share=0.15),
    Policy("learned + hedge 100ms, cap 15 %", learned=True, hedge=HedgeAfter(fixed_s=0.1),
           max_share=0.15),
    Policy("learned + hedge 100ms, cap 25 %", learned=True, hedge=HedgeAfter(fixed_s=0.1),
           max_share=0.25),
    Policy("learned + hedge 100ms, cap 25 %, 2 routes", learned=True,
           hedge=HedgeAfter(fixed_s=0.1), max_share=0.25, racers=2),
    Policy("learned + continue", learned=True, on_break="continue"),
    Policy("learned + hedge p95 + continue", learned=True, hedge=HedgeAfter(quantile=0.95),
           on_break="continue"),
)

_ALIKE = ("a", "b", "c")
RELIABILITY_SCENARIOS: tuple[ReliabilityScenario, ...] = (
    ReliabilityScenario("r1-slow-tail", "1 first byte in 10 takes 100x longer (20 ms -> 2 s)",
                        tuple(SimRoute(n, tail_share=0.1) for n in _ALIKE)),
    ReliabilityScenario("r2-dying", "streams break mid-way (8 %) or fall silent (4 %)",
                        tuple(SimRoute(n, breaks_share=0.08, stalls_share=0.04)
                              for n in _ALIKE)),
    ReliabilityScenario("r3-issue-34", "issue 34's case: 20 ms first bytes, 2 s one in 25",
                        tuple(SimRoute(n, tail_share=0.04) for n in _ALIKE)),
    ReliabilityScenario("r4-provider-stalls", "provider streams (first byte 400 ms, chunks "
                        "~25 ms apart) falling silent mid-answer (5 %)",
                        tuple(SimRoute(n, ttfb_s=0.4, tps=40.0, stalls_share=0.05)
                              for n in _ALIKE)),
)


@dataclass(slots=True)
class ReliabilityResult:
    """What the clients got: times to first token, answers whole, tokens, upstream requests."""

    ttft_s: list[float] = field(default_factory=list)
    seconds: float = 0.0  # summed over requests: first request byte to last answer byte
    tokens: int = 0  # in answers delivered whole
    whole: int = 0  # answers delivered whole
    upstream: int = 0  # upstream requests sent
    hedges: int = 0  # the run's HedgeCap.hedges, its one count

    def summary(self) -> dict[str, float]:
        n = len(self.ttft_s)
        return {"requests": n, "p99_ttft_s": quantile(self.ttft_s, 0.99),
                "mean_ttft_s": sum(self.ttft_s) / n,
                "extra_upstream": self.upstream / n - 1.0, "hedges": self.hedges / n,
                "whole": self.whole / n, "delivered_tps": self.tokens / self.seconds}


class _Learned:
    """Per route: its last first-byte times and longest gaps (the gateway's windows): the
    deadlines' first bytes (`first`: heads that came, chat/forward.py) apart from the
    hedge's (`hedged`: every race's winner and a loser's wait as a lower bound,
    chat/hedge.py), so a loser cancelled early never lowers its route's deadline."""

    def __init__(self) -> None:
        self.first: dict[str, deque[float]] = {}
        self.hedged: dict[str, deque[float]] = {}
        self.gaps: dict[str, deque[float]] = {}

    @staticmethod
    def _add(table: dict[str, deque[float]], route: str, seconds: float) -> None:
        table.setdefault(route, deque(maxlen=WINDOW)).append(seconds)

    @staticmethod
    def _deadline(table: dict[str, deque[float]], route: str) -> float | None:
        times = table.get(route)
        return learned_s(times) if times is not None and len(times) >= MIN_SAMPLES else None

    def quantile(self, route: str, q: float) -> float | None:
        times = self.hedged.get(route)
        return quantile(times, q) if times is not None and len(times) >= MIN_SAMPLES else None


class _Run:
    def __init__(self, scenario: ReliabilityScenario, policy: Policy, seed: int) -> None:
        self.scenario, self.policy = scenario, policy
        self.rng = random.Random(seed)
        self.cap = HedgeCap(policy.max_share)
        self.learned = _Learned()
        self.out = ReliabilityResult()

    def _noise(self) -> float:
        sigma = self.scenario.noise_sigma
        return math.exp(self.rng.gauss(-sigma * sigma / 2, sigma))

    def _first_byte(self, route: SimRoute) -> float:
        self.out.upstream += 1
        tail = route.tail_factor if self.rng.random() < route.tail_share else 1.0
        return route.ttfb_s * tail * self._noise()

    def _first_deadline(self, route: SimRoute) -> float:
        learned = (self.learned._deadline(self.learned.first, route.name)
                   if self.policy.learned else None)
        return min(learned, self.policy.first_byte_timeout_s) if learned is not None \
            else self.policy.first_byte_timeout_s

    def _opened(self, order: list[SimRoute],
                hedged: bool = True) -> tuple[float, SimRoute] | None:
        """Seconds to the first byte and the route that sent it, or None (all failed): a
        race on the next routes (hedged unless not `hedged`: a continuation is not, as in
        chat/forward.py), and after a race all failed, the next."""
        spent, k = 0.0, 0
        while k < len(order):
            seconds, won, used = self._race(order[k:], self.policy.racers if hedged else 1)
            spent += seconds
            if won is not None:
                return spent, won
            k += used
        return None

    def _race(self, order: list[SimRoute],
              most: int) -> tuple[float, SimRoute | None, int]:
        """One race from `order[0]`: (seconds, the route that sent the first byte or None,
        routes used). Each racer without its first byte by its route's hedge delay gets the
        next route beside it, up to `most` (chat/hedge.py)."""
        racers: list[tuple[SimRoute, float, float, float]] = []  # route, start, first, cut

        def launch(route: SimRoute, start: float) -> None:
            racers.append((route, start, self._first_byte(route), self._first_deadline(route)))

        launch(order[0], 0.0)
        while len(racers) < min(most, len(order)):
            route, start, first, cut = racers[-1]
            delay = self._hedge_delay(route)
            if delay is None:
                break
            at = start + delay
            if any(s + f <= at and f <= c for _, s, f, c in racers) or start + cut <= at:
                break  # answered before, or the latest racer was cut before: no hedge
            if not self.cap.take():
                break
            launch(order[len(racers)], at)
        answered = [(s + f, r) for r, s, f, c in racers if f <= c]
        at, won = min(answered, key=lambda a: a[0]) if answered else (math.inf, None)
        for route, start, first, cut in racers:
            if route is won:
                self.learned._add(self.learned.first, route.name, first)
                self.learned._add(self.learned.hedged, route.name, first)
            elif start + cut <= at:  # cut at its deadline first
                if self.policy.learned and cut < self.policy.first_byte_timeout_s:
                    self.learned.first.pop(route.name, None)  # cut: cold again
            else:  # a loser still waiting: its wait, a lower bound
                self.learned._add(self.learned.hedged, route.name, at - start)
        if won is None:
            return max(s + c for _, s, _, c in racers), None, len(racers)
        return at, won, len(racers)

    def _hedge_delay(self, route: SimRoute) -> float | None:
        after = self.policy.hedge
        if after is None or not self.cap.may():
            return None
        if after.quantile is None:
            return after.delay_s(None)
        return after.delay_s(self.learned.quantile(route.name, after.quantile),
                             self.learned.quantile(route.name, 0.5))

    def _streamed(self, route: SimRoute, tokens: int) -> tuple[float, int, bool]:
        """(seconds, tokens delivered, whole) of one route's stream of `tokens`."""
        gap = 1.0 / (route.tps * self._noise())
        draw = self.rng.random()
        if draw >= route.breaks_share + route.stalls_share or tokens < 2:
            self.learned._add(self.learned.gaps, route.name, gap)
            return tokens * gap, tokens, True
        at = self.rng.randrange(1, tokens)  # the token it breaks or stalls after
        seconds = at * gap
        if draw >= route.breaks_share:  # silent: cut at the learned gap or the idle timeout
            learned = (self.learned._deadline(self.learned.gaps, route.name)
                       if self.policy.learned and self.policy.learned_gap else None)
            seconds += min(learned or math.inf, self.policy.idle_timeout_s)
            self.learned.gaps.pop(route.name, None)
        return seconds, at, False

    def request(self, i: int) -> None:
        routes = self.scenario.routes
        order = [routes[(i + k) % len(routes)] for k in range(len(routes))]
        self.cap.seen()
        tokens = self.rng.randint(*self.scenario.tokens)
        opened = self._opened(order)
        if opened is None:
            return
        ttft, route = opened
        self.out.ttft_s.append(ttft)
        seconds, done, whole = self._streamed(route, tokens)
        seconds += ttft
        policy = self.policy
        if not whole and policy.on_break != "error":
            at = order.index(route) + 1
            rest = order[at:] + order[:at]
            again = self._opened(rest, hedged=policy.on_break != "continue")
            if again is not None:
                left = tokens - done if policy.on_break == "continue" else tokens
                more, _, whole = self._streamed(again[1], left)
                seconds += again[0] + more
        self.out.seconds += seconds
        if whole:
            self.out.whole += 1
            self.out.tokens += tokens


def run_reliability(scenario: ReliabilityScenario, policy: Policy,
                    seed: int = 1) -> ReliabilityResult:
    """One policy over one scenario's requests, one after another."""
    run = _Run(scenario, policy, seed)
    for i in range(scenario.requests):
        run.request(i)
    run.out.hedges = run.cap.hedges
    return run.out
