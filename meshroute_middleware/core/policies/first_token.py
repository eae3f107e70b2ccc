"""A request's time to its first token on a route, as thompson learns and prices it (issues
26 and 31): the prefill of what the route does not hold (`prefill.PrefillModel`), and the
wait for a slot, learned per route and per count of requests ahead; a request carrying a
prompt is scored by its answer's tokens over its whole expected time, first token
included."""

from __future__ import annotations

from collections.abc import Iterable

from ..saturation import CURVES, CurveBelief, g_at
from .base import Arm, Outcome
from .marginal import NEIGHBOUR_WEIGHT, neighbours_loss, queue_share
from .prefill import KILO, PrefillModel

# A request that carries a prompt is scored by its answer's tokens over its total time plus
# this many times its time to first token (the wait for a slot past the route's knee and the
# prefill of what the route does not hold): a conversation's first token is what a chat
# waits for, and a turn queued on a full batch or moved cold pays it. 1 measured best of
# {0, 1, 2} on scenario 17 (tuning seeds 1-10, docs/benchmarks.md): 0 queues (TTFT 1.6x the
# oracle's), 2 gives up delivered tokens/s on 19 (0.975).
TTFT_WEIGHT = 1.0
# The wait for a slot, learned: per route and per count of attempts ahead when one began,
# an EWMA (this weight per sample) of its time to first token beyond the learned prefill.
# The knee alone cannot tell it: a batch never filled past its knee leaves the curves past
# it alike, and their bins fade, so the knee is re-tried, on a conversation that then stays
# (scenario 17: TTFT 1.33x the oracle's with the knee's wait only, 1.15x learned; 0.1 of
# {0.05, 0.1, 0.25}).
WAIT_ALPHA = 0.1
MAX_AHEAD = 64  # counts ahead learned apart (more share the last)
# A first byte within this share of a request's time of its last brought the whole answer (a
# request not streamed): its time is decode and prefill together, no sample of either.
AT_ONCE_SHARE = 0.01


class FirstTokens:
    """Per route: the prefill fit and the waits for a slot, learned from first tokens."""

    def __init__(self) -> None:
        self.prefill = PrefillModel()
        # Per route, per attempts ahead when it began: an EWMA of the time to first token
        # beyond the learned prefill (the base latency plus any wait for a slot).
        self.waits: dict[str, dict[int, float]] = {}

    def expected_ttft(self, arm: Arm) -> float | None:
        """Seconds to the first token of this request on the route by its prefill fit
        (base + slope x the prompt's uncached tokens: the `ttft` objective,
        core/objectives.py); None without a prompt, or before the route's first token was
        measured with one."""
        prefix, signature = arm.prefix, arm.route.signature
        if prefix is None or not self.prefill.measured(signature):
            return None
        base, slope = self.prefill.fit(arm.route.model, signature)
        return base + slope * max(prefix.prompt_tokens - arm.warm_tokens, 0) / KILO

    def score(self, arm: Arm, drawn: tuple[float, float, int], answer_tokens: float,
              weight: float = NEIGHBOUR_WEIGHT,
              wait: tuple[float | None, float] = (None, 0.0)) -> float:
        """A request's net goodput on the arm given one posterior draw `drawn` (reliability,
        speed alone, curve), with the request's own speed counting its expected
        time to first token: the answer's tokens over (decode + prefill of what the route
        does not hold + TTFT_WEIGHT x (that prefill + the wait for a slot)), minus the same
        share of what its batch neighbours lose (all of it for a prompt cold everywhere on a
        route whose announced slots are full). The wait (`wait_s`): as learned at this
        count ahead, else past the drawn curve's knee times the belief that it queues."""
        p, s1, j = drawn
        n = arm.in_flight
        own = p * s1 * g_at(j, n + 1) if n else p * s1
        slots = arm.route.slots
        if n and slots is not None and n >= slots and weight == NEIGHBOUR_WEIGHT:
            # A prompt cold everywhere on a route whose slots are full delays all behind
            # it (as `gain`); a warm one keeps its share: moving costs its prefill.
            weight = 1.0
        lost = p * neighbours_loss(s1, j, n)[1] * weight if n else 0.0
        prefix = arm.prefix
        if prefix is not None and own > 0.0:
            uncached = max(prefix.prompt_tokens - arm.warm_tokens, 0)
            prefill = (self.prefill.prefill_s(arm.route.model, arm.route.signature, uncached)
                       if uncached else 0.0)
            learned, queue_share = wait
            knee = CURVES[j][0]
            if learned is not None:
                waiting = learned
            elif queue_share > 0.0 and n + 1 > knee:
                # past the knee it waits for one of `knee` slots, each serving at the full
                # batch's speed: (n + 1 - knee) / knee answers' decode time
                waiting = queue_share * (n + 1 - knee) / knee * answer_tokens / (
                    p * s1 * g_at(j, int(knee)))
            else:
                waiting = 0.0
            if prefill > 0.0 or waiting > 0.0:
                decode = answer_tokens / own
                # Its neighbours' loss counts per second it decodes beside them, of its time
                # but the wait: unscaled, a short answer behind a long prompt made every busy
                # route score below zero, and new conversations fled to the idlest route
                # however slow (bench_realtime.py slow-a, 16 clients, 20 s: 10 of ~47 new
                # conversations on the node at a fifth, 1.8x the oracle's TTFT; 1-3 with).
                lost *= decode / (decode + prefill + TTFT_WEIGHT * prefill)
                own = answer_tokens / (decode + prefill + TTFT_WEIGHT * (prefill + waiting))
        return own - lost

    def wait_s(self, arm: Arm, curve: CurveBelief | None) -> tuple[float | None, float]:
        """What a request joining the arm's in-flight ones waits for a slot: the seconds
        learned at that count beyond the route's quickest count measured (None: never
        measured there), and the posterior's belief that it queues (the fallback)."""
        n = arm.in_flight
        slots = arm.route.slots
        if not n or (slots is not None and n < slots):
            # nothing ahead, or a slot its server announced is free: no wait. What a request
            # beside others learned is their slowdown, priced by the curve (issue 31: a
            # wait learned behind a neighbour's cold prefill sent returning turns cold)
            return None, 0.0
        waits = self.waits.get(arm.route.signature)
        at = waits.get(min(n, MAX_AHEAD)) if waits else None
        if at is None or waits is None:
            return None, queue_share(curve, n)
        low = min(w for k, w in waits.items() if k <= n)
        return (at - low if at > low else 0.0), 0.0

    def learn(self, model: str, signature: str, outcome: Outcome) -> float | None:
        """Learn the route's prefill from this request's first token, and its speed with
        the prefill part left out, so that a route is not thought slow for having received
        cold prompts (issue 26): at most what the fit says the uncached tokens cost."""
        uncached, ttfb = outcome.uncached_tokens, outcome.ttfb_s
        if not 0.0 <= ttfb <= outcome.seconds:
            return outcome.tps
        if outcome.seconds - ttfb <= AT_ONCE_SHARE * outcome.seconds:
            return outcome.tps  # the first byte brought the whole answer: not a first token
        self.prefill.add(model, signature, uncached, ttfb)
        if uncached:
            base, slope = self.prefill.fit(model, signature)
            prefill = min(slope * uncached / KILO, max(ttfb - base, 0.0))
            beyond = ttfb - slope * uncached / KILO
        else:  # a warm prompt: no prefill to leave out (the fit is not needed)
            prefill, beyond = 0.0, ttfb
        if outcome.ahead >= 0:  # what its first token waited beyond the prefill
            waits = self.waits.get(signature)
            if waits is None:
                waits = self.waits[signature] = {}
            k = min(outcome.ahead, MAX_AHEAD)
            old = waits.get(k)
            waits[k] = beyond if old is None else old + WAIT_ALPHA * (beyond - old)
            if outcome.slot_free:
                # a slot was free: what its first token waited past the route's base was a
                # neighbour's prefill, not its own decode (issue 31: one turn behind a cold
                # prefill read as a 4x slower llama-server, and its change detector fired)
                low = min(w for j, w in waits.items() if j <= k)
                prefill += min(max(beyond - low, 0.0), max(ttfb - prefill, 0.0))
        if not prefill:
            return outcome.tps
        return outcome._replace(seconds=outcome.seconds - prefill).tps

    def forget(self, signatures: Iterable[str]) -> None:
        """Drop what was learned of these routes."""
        gone = set(signatures)
        self.prefill.forget(gone)
        for signature in gone:
            self.waits.pop(signature, None)
