"""The `ttft` objective on the mesh (issue 26): the route of least expected time to first
token, drawn so that every route's first token is measured (core/objectives.py).

Pure: arms, `rng` and the policy's estimate come in; an index and a mode go out.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

from ..kinds import EXPLOIT, GREEDY, SCOUT, DecisionMode
from .base import Arm

# Log-space spread of one first-token measurement: x1.6 either way at 1 sigma (a queue, a
# cold prompt). The draw's spread is this over the root of the route's decayed sample mass,
# so a route measured long ago is re-tried as its mass decays.
TTFT_SIGMA = 0.5
# Beta prior on reliability, as thompson's (mean 0.95 with the weight of two requests).
PRIOR_OK, PRIOR_FAIL = 1.9, 0.1

# A policy's own estimate of a request's time to first token on an arm (thompson's
# `expected_ttft`: its learned prefill of the prompt's uncached part), None when it has none.
TtftEstimate = Callable[[Arm], float | None]


def ttft_choice(arms: Sequence[Arm], rng: random.Random,
                estimate: TtftEstimate | None = None) -> tuple[int, DecisionMode]:
    """The arm of least drawn time to first token: an arm never measured first (best prior
    first, "greedy-fallback" while none is measured), else a log-normal draw around its
    expected first-token time (the policy's `estimate`, else the decayed mean measured),
    × (1 + requests in flight on it: each one ahead may hold up its prefill), over its
    mean reliability (a failure costs another attempt)."""
    best, best_s, untried, untried_prior = 0, math.inf, -1, -1.0
    known = False
    for i, arm in enumerate(arms):
        view = arm.view
        mean = estimate(arm) if estimate is not None else None
        if mean is None:
            mean = view.ttfb_s
        if mean is None:
            if not arm.in_flight and arm.prior_tps > untried_prior:
                untried, untried_prior = i, arm.prior_tps
            continue
        known = True
        sd = TTFT_SIGMA / math.sqrt(max(view.mass, 1e-3))
        drawn = max(mean, 1e-4) * math.exp(min(sd, 3.0 * TTFT_SIGMA) * rng.gauss(0.0, 1.0))
        reliability = (PRIOR_OK + view.ok) / (PRIOR_OK + PRIOR_FAIL + view.ok + view.fail)
        seconds = drawn * (1 + arm.in_flight) / reliability
        if seconds < best_s:
            best, best_s = i, seconds
    if untried >= 0:
        return untried, (SCOUT if known else GREEDY)
    return best, EXPLOIT


def ttft_rank(arm: Arm) -> tuple[int, float]:
    """Fallback order under `ttft`: measured arms by their mean first-token time, then the
    rest by prior."""
    ttfb = arm.view.ttfb_s
    if ttfb is not None:
        return (0, ttfb)
    return (1, -arm.route.prior_tps)
