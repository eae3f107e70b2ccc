"""What a warm prefix saves on a route, learned from the route's own time to first token.

A request that carries its prompt's message chain reports how many prompt tokens the route
was not known to hold (`Outcome.uncached_tokens`). Time to first token is modelled as
base + slope × uncached tokens: a decayed least-squares fit per route (recent samples
weigh most, so a route that slows is followed), shrunk toward the fit pooled over the
model's routes while a route has few samples. The pooled fit shrinks the base toward 0 and
leaves the slope almost free: while every sample had a prompt of one size (a conversation's
cold first turns) the data cannot split a first token's time between the two, and a real
server's is prefill (llama.cpp, 300 cold tokens: 3-4 s of a first token's 3-4 s; a warm
turn's 0.1-0.3 s). Crediting it to the base instead made a cold prefill look nearly free,
and returning turns moved off their warm server (issue 31). Warm samples (few uncached
tokens) then tell the base apart; a server whose warm prefix saves nothing shows it as a
large base and a flat slope.
"""

from __future__ import annotations

from dataclasses import dataclass

KILO = 1000.0  # the fit's x is in thousands of tokens (a well-conditioned 2x2 system)
# Each sample's weight shrinks by this per newer sample (~200 samples): slow enough to keep
# the cold samples that tell the slope while a route serves mostly warm turns.
FORGET = 0.995
POOLED_FORGET = 0.999  # the model-wide fit forgets slower (it pools every route)
ROUTE_PRIOR = 2.0  # weight of the pooled fit in a route's fit (samples' worth)
POOLED_PRIOR = 0.5  # weight of "base 0" in the pooled fit
POOLED_SLOPE_PRIOR = 0.01  # ... and of "slope 0": the slope is the data's (conditioning only)


@dataclass(slots=True)
class PrefillFit:
    """Decayed sums of (x = uncached kilotokens, y = time to first token)."""

    forget: float = FORGET
    samples: int = 0  # added so far (a version: a solve cached for it is still right)
    s0: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def add(self, uncached_tokens: int, ttfb_s: float) -> None:
        """One sample."""
        x, f = uncached_tokens / KILO, self.forget
        self.samples += 1
        self.s0 = self.s0 * f + 1.0
        self.sx = self.sx * f + x
        self.sy = self.sy * f + ttfb_s
        self.sxx = self.sxx * f + x * x
        self.sxy = self.sxy * f + x * ttfb_s

    def solve(self, base0: float, slope0: float, weight: float,
              slope_weight: float | None = None) -> tuple[float, float]:
        """(base seconds, seconds per kilotoken), ridge-shrunk toward (base0, slope0) with
        `weight` samples' worth on the base and `slope_weight` (default: `weight`) on the
        slope; the slope never below 0."""
        w1 = weight if slope_weight is None else slope_weight
        a00, a01, a11 = self.s0 + weight, self.sx, self.sxx + w1
        b0 = self.sy + weight * base0
        b1 = self.sxy + w1 * slope0
        det = a00 * a11 - a01 * a01
        if det <= 1e-12:
            return base0, slope0
        base = (a11 * b0 - a01 * b1) / det
        slope = (a00 * b1 - a01 * b0) / det
        if slope < 0.0:  # refit the base alone with no prefill cost
            return (self.sy + weight * base0) / (self.s0 + weight), 0.0
        return base, slope


class PrefillModel:
    """Per route and pooled per model: time to first token against uncached tokens."""

    def __init__(self) -> None:
        self._routes: dict[str, PrefillFit] = {}
        self._pooled: dict[str, PrefillFit] = {}
        # per model, the pooled prior as solved at its sample count (every arm of a decision
        # reads it: solved once per sample, not once per arm)
        self._priors: dict[str, tuple[int, tuple[float, float]]] = {}

    def __len__(self) -> int:
        return len(self._routes)

    def add(self, model: str, signature: str, uncached_tokens: int, ttfb_s: float) -> None:
        """Learn from one request's time to first token."""
        fit = self._routes.get(signature)
        if fit is None:
            fit = self._routes[signature] = PrefillFit()
        fit.add(uncached_tokens, ttfb_s)
        pooled = self._pooled.get(model)
        if pooled is None:
            pooled = self._pooled[model] = PrefillFit(POOLED_FORGET)
        pooled.add(uncached_tokens, ttfb_s)

    def fit(self, model: str, signature: str) -> tuple[float, float]:
        """(base seconds, prefill seconds per kilotoken) of a route."""
        pooled = self._pooled.get(model)
        if pooled is None:
            prior = (0.0, 0.0)
        else:
            cached = self._priors.get(model)
            if cached is not None and cached[0] == pooled.samples:
                prior = cached[1]
            else:
                prior = pooled.solve(0.0, 0.0, POOLED_PRIOR, POOLED_SLOPE_PRIOR)
                self._priors[model] = (pooled.samples, prior)
        fit = self._routes.get(signature)
        if fit is None:
            return prior
        return fit.solve(prior[0], prior[1], ROUTE_PRIOR)

    def measured(self, signature: str) -> bool:
        """Whether a route has first tokens of its own in the fit (objectives' `ttft`)."""
        return signature in self._routes

    def prefill_s(self, model: str, signature: str, uncached_tokens: int) -> float:
        """Expected seconds a route spends on a prompt's uncached tokens."""
        return self.fit(model, signature)[1] * uncached_tokens / KILO

    def forget(self, signatures: set[str]) -> None:
        """Drop the fits of these routes (pruned with their beliefs)."""
        for signature in signatures:
            self._routes.pop(signature, None)
