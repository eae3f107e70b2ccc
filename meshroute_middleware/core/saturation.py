"""How a route's speed responds to load: a learned saturation curve per route.

A request on a route with `c` requests in flight runs at `s1 · g(c)` tokens/s, where
`g(c) = 1 / (1 + slowdown · (min(c, knee) − 1)) · min(1, knee / c)`: up to `knee` requests
share a batch, each slowed by `slowdown` per neighbour, and beyond the knee they queue. A
serial server is `knee = 1`; vLLM / TGI / llama.cpp `--parallel` are a knee at their slot
count with a small slowdown; a server whose batch saturates has both. The route's total
throughput is `T(c) = c · s1 · g(c)`, concave in c.

`CurveBelief` keeps the sufficient statistics of a route's samples (log tokens/s, binned by
the concurrency the request ran at, decayed and capped) and a posterior over a grid of
(knee, slowdown) pairs, `log s1` Gaussian given each pair. Thompson sampling draws one curve
per decision. A CUSUM on the standardised residuals against the best-fitting curve detects a
change (a slowdown or a recovery) and forgets the old samples, so the route is re-learnt
within a handful of samples. Pure: `now` is passed in, randomness comes from the caller's rng.
"""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass, field

from .defaults import OBS_SIGMA

# The (knee, slowdown) grid the posterior lives on. Knees: slot counts seen in practice
# (llama.cpp --parallel 1-8, vLLM max_num_seqs up to 256, 10**9 = no limit). Slowdowns:
# per-neighbour cost of batching, 0 (free, memory-bound decode) to 1 (no gain: serial).
KNEES = (1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0, 16.0, 32.0, 1e9)
SLOWDOWNS = (0.0, 0.02, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1.0)
CURVES = tuple((k, b) for k in KNEES for b in SLOWDOWNS)
N_CURVES = len(CURVES)
BINS_PER_OCTAVE = 4  # concurrency bins: 1, 1.19, 1.41, 1.68, 2, ...
# Change detection (Page's CUSUM, 1954) on standardised log-tps residuals: reference
# k = 0.5 sigma; threshold h = 8 rather than the textbook 4-5 because sigma is itself estimated
# and a cut makes the next residuals noisier: at h = 6 a stationary route at sigma 0.3 raised
# 9 alarms in 3,000 samples (tests/core/test_saturation.py), at h = 8 the average run length
# is ~10^4, and a halving is still caught in ~5 samples at sigma 0.3, ~10 at sigma 0.5.
# A change forgets every old sample, at every concurrency: a few stale samples at a
# concurrency no longer tried would otherwise fix a wrong knee that nothing re-tests (seen
# in scenario 13: a recovered server believed to saturate at 2 for the rest of the run).
CUSUM_K, CUSUM_H = 0.5, 8.0
CUSUM_MIN_MASS = 4.0  # samples in a concurrency bin before its residuals are tested
# The fit is redone once the samples since the last one exceed this share of the mass
# (every sample while few are known, every tenth at the mass cap): old fits differ little.
REFIT_SHARE = 0.05
# A concurrency no longer visited fades from the fit: its bin counts half after this many
# samples at other concurrencies. Without it a few stale samples (a slowdown seen at 3 in
# flight) fix a knee that nothing re-tests; with it the curve beyond what is visited grows
# uncertain again and Thompson sampling re-tries it (scenario 13).
BIN_HALF_LIFE_SAMPLES = 50.0
MAX_MASS = 200.0  # cap on the decayed sample mass: an EWMA with weight >= 1/201
PRIOR_SIGMA_MASS = 2.0  # samples the prior spread (OBS_SIGMA) is worth
MIN_SIGMA = 0.05
# Bins a route's shared summary carries at most (gossip, issue 14; more are merged, see
# `CurveBelief.summary`): 1-32 in flight span 20 bins, of which a route visits a few.
SUMMARY_BINS = 8
# A route whose server announces its slots (core/slot_count.py: how many requests it runs at
# once; more queue) has its knee there, the grid's smallest knee >= the slots: the prior over
# CURVES weighs every other knee down, a knee below by exp(-SLOTS_BELOW) (a server may run
# out of memory or compute before its slots: vLLM preempts), one above by exp(-SLOTS_ABOVE)
# (it cannot batch more than it says, unless its samples insist: an announcement is a
# prior, never trusted outright). Without it a 4-slot server is believed to batch 16 until
# its queue was paid for: scenario 17's first conversations queue there (TTFT 1.15x the
# oracle's held out, 1.02x with it). 2 of {1, 2, 3, 5} below (docs/benchmarks.md).
SLOTS_BELOW, SLOTS_ABOVE = 2.0, 7.0


def log_g(c: float, knee: float, slowdown: float) -> float:
    """log of the per-request speed factor at concurrency c (>= 1) for one curve."""
    c = max(c, 1.0)
    batch = min(c, knee)
    out = -math.log1p(slowdown * (batch - 1.0))
    if c > knee:
        out -= math.log(c / knee)
    return out


# g(n) of every curve at whole in-flight counts 0..MAX_TABULATED (g(0) = g(1) = 1): a
# decision reads these instead of computing logarithms.
MAX_TABULATED = 64
G_TABLE: tuple[tuple[float, ...], ...] = tuple(
    tuple(math.exp(log_g(n, knee, slowdown)) for n in range(MAX_TABULATED + 1))
    for knee, slowdown in CURVES)


def g_at(j: int, n: int) -> float:
    """g(n) of curve j for a whole in-flight count n >= 0."""
    if n <= MAX_TABULATED:
        return G_TABLE[j][n]
    knee, slowdown = CURVES[j]
    return math.exp(log_g(n, knee, slowdown))


def throughput(n: int, s1: float, knee: float, slowdown: float) -> float:
    """Total tokens/s T(n) of a route with n requests in flight."""
    return n * s1 * math.exp(log_g(n, knee, slowdown)) if n > 0 else 0.0


def bin_of(c: float) -> int:
    """The concurrency bin of a sample that ran at average concurrency c."""
    return round(BINS_PER_OCTAVE * math.log2(max(c, 1.0)))


def slots_knee(slots: int | None) -> int:
    """1 + the index in KNEES of the knee a server announcing `slots` has (the smallest
    knee >= slots); 0 when it says none, or more than the grid tells apart (past 32)."""
    if not slots:
        return 0
    k = bisect.bisect_left(KNEES, slots)
    return k + 1 if k < len(KNEES) - 1 else 0


def _prior_logs(knee: int) -> tuple[float, ...]:
    """The log prior weight of every curve given `slots_knee`'s result (0: flat)."""
    k = knee - 1
    return tuple(0.0 if knee == 0 or i == k else (-SLOTS_BELOW if i < k else -SLOTS_ABOVE)
                 for i in range(len(KNEES)) for _ in SLOWDOWNS)


def _cumulate(logs: Iterable[float]) -> list[float]:
    """Cumulative weights of log weights (shifted by their maximum)."""
    logs = list(logs)
    top = max(logs)
    cum, acc = [], 0.0
    for lw in logs:
        acc += math.exp(lw - top)
        cum.append(acc)
    return cum


PRIOR_LOGS = tuple(_prior_logs(k) for k in range(len(KNEES)))
PRIOR_CUMS = tuple(tuple(_cumulate(logs)) for logs in PRIOR_LOGS)


def prior_draw(rng: random.Random, knee: int) -> int:
    """A curve index drawn from the prior alone (`slots_knee`'s result; one rng.random()
    if a knee is known, else rng.randrange over the grid as before the prior existed)."""
    if not knee:
        return rng.randrange(N_CURVES)
    cum = PRIOR_CUMS[knee]
    j = bisect.bisect_right(cum, rng.random() * cum[-1])
    return j if j < N_CURVES else N_CURVES - 1


def _log_gs(c: float) -> list[float]:
    """log g at concurrency c for every curve of the grid."""
    return [log_g(c, knee, slowdown) for knee, slowdown in CURVES]


@dataclass(slots=True)
class _Bin:
    mass: float = 0.0
    mean: float = 0.0  # of log tps
    m2: float = 0.0  # mass-weighted squared deviations from mean
    c: float = 1.0  # mass-weighted mean concurrency
    last: int = 0  # the route's sample count when this bin was last updated


@dataclass(slots=True)
class CurveBelief:
    """The decayed samples of one route and the posterior over its saturation curve."""

    bins: dict[int, _Bin] = field(default_factory=dict)
    mass: float = 0.0
    t: float = 0.0
    cusum_up: float = 0.0
    cusum_down: float = 0.0
    changes: int = 0  # detected change points (for tests and display)
    samples: int = 0  # taken in all
    # The posterior as of the last fit: (cumulative weights, mean log s1 per curve, MAP
    # index, sigma()); None once a sample or a change calls for a refit (see `add`).
    _post: tuple[list[float], list[float], int, float] | None = None
    _since_fit: int = 0  # samples taken since the fit
    knee: int = 0  # the announced slots' knee (`slots_knee`), the prior's; 0: a flat prior

    def set_knee(self, knee: int) -> None:
        """The prior's knee from the route's announced slots (`slots_knee`): a change
        calls for a refit."""
        if knee != self.knee:
            self.knee = knee
            self._post = None

    def decay(self, d: float) -> None:
        """Multiply every sample weight by d (time decay)."""
        if d >= 1.0:
            return
        for b in self.bins.values():
            b.mass *= d
            b.m2 *= d
        self.mass *= d

    def sigma(self) -> float:
        """Per-request noise of log tps: pooled within-bin spread shrunk toward OBS_SIGMA."""
        m2 = sum(b.m2 for b in self.bins.values())
        var = (OBS_SIGMA * OBS_SIGMA * PRIOR_SIGMA_MASS + m2) / (PRIOR_SIGMA_MASS + self.mass)
        return max(math.sqrt(var), MIN_SIGMA)

    def spread(self) -> float:
        """sigma() as of the last fit (cheap: read on every decision)."""
        return (self._post or self.posterior())[3]

    def add(self, tps: float, c: float) -> bool:
        """Take one sample (tokens/s at average concurrency c); return whether it completed
        a detected change."""
        x = math.log(tps)
        changed = False
        key = bin_of(c)
        b = self.bins.get(key)
        if b is not None and b.mass >= CUSUM_MIN_MASS:
            # The residual against the bin's own mean, not the fitted curve: a coarse grid's
            # misfit, or a curve guessed from few samples, must not read as a change. A bin
            # with fewer samples has little mass to forget anyway.
            z = (x - b.mean) / (self.sigma() * math.sqrt(1.0 + 1.0 / b.mass))
            changed = self._shifted(z)
            if changed:  # forget every bin: stale ones would bend the curve's shape
                self.bins.clear()
                self.mass = 0.0
                self.changes += 1
                self._post = None
        if self.mass + 1.0 > MAX_MASS:
            self.decay((MAX_MASS - 1.0) / self.mass)
        self.samples += 1
        b = self.bins.setdefault(key, _Bin(c=c))
        b.last = self.samples
        m1 = b.mass + 1.0
        delta = x - b.mean
        b.mean += delta / m1
        b.m2 += b.mass * delta * delta / m1
        b.c += (c - b.c) / m1
        b.mass = m1
        self.mass += 1.0
        self._since_fit += 1
        if self._since_fit > REFIT_SHARE * self.mass:
            self._post = None
        return changed

    def _shifted(self, z: float) -> bool:
        """Two-sided CUSUM on standardised residuals (Page 1954): a sustained shift."""
        self.cusum_up = max(0.0, self.cusum_up + z - CUSUM_K)
        self.cusum_down = max(0.0, self.cusum_down - z - CUSUM_K)
        if self.cusum_up > CUSUM_H or self.cusum_down > CUSUM_H:
            self.cusum_up = self.cusum_down = 0.0
            return True
        return False

    def fit(self) -> tuple[list[float], list[float], int]:
        """Posterior over CURVES: (cumulative weights, mean log s1 per curve, MAP index)."""
        cum, mus, best, _ = self._post or self.posterior()
        return cum, mus, best

    def posterior(self) -> tuple[list[float], list[float], int, float]:
        """`fit()` and the `spread()` it was made with, in one tuple: what a decision reads.

        Cached until a sample or a change calls for a refit (`add`: every sample while few
        are known, past REFIT_SHARE of the mass later); decay alone keeps it (all bins
        shrink alike: the same means and MAP). Each curve's log s1 is the mass-weighted mean of
        (bin mean − log g); its likelihood exp(−SSE / 2σ²) over the bin means; the prior
        over the grid is flat, or peaks at the announced slots' knee (`set_knee`).
        """
        post = self._post
        if post is not None:
            return post
        self._since_fit = 0
        sigma = self.sigma()
        bins = [(b.mass * 0.5 ** ((self.samples - b.last) / BIN_HALF_LIFE_SAMPLES), b.mean,
                 _log_gs(b.c)) for b in self.bins.values() if b.mass > 1e-9]
        total = sum(m for m, _, _ in bins)
        if total <= 0:
            post = self._post = (list(PRIOR_CUMS[self.knee]), [0.0] * len(CURVES),
                                 max(self.knee - 1, 0) * len(SLOWDOWNS), sigma)
            return post
        var2 = 2.0 * sigma ** 2
        prior = PRIOR_LOGS[self.knee]
        logs, mus = [], []
        for j in range(len(CURVES)):
            # Σ m (x − g − mu)² = Σ m (x − g)² − M mu², with mu = Σ m (x − g) / M
            s1 = s2 = 0.0
            for m, mean, gs in bins:
                r = mean - gs[j]
                s1 += m * r
                s2 += m * r * r
            mu = s1 / total
            logs.append(-max(s2 - total * mu * mu, 0.0) / var2 + prior[j])
            mus.append(mu)
        top = max(logs)
        post = self._post = (_cumulate(logs), mus, logs.index(top), sigma)
        return post

    def peek(self) -> tuple[list[float], list[float], int, float]:
        """`posterior()` for display: a fit made now is not kept, so reading it never moves
        when the next decision's refit happens (the decisions stay what they would be)."""
        post = self._post
        if post is not None:
            return post
        since = self._since_fit
        post = self.posterior()
        self._post, self._since_fit = None, since
        return post

    def draw(self, rng: random.Random) -> int:
        """One curve index drawn from the posterior (one `rng.random()`)."""
        cum = (self._post or self.posterior())[0]
        j = bisect.bisect_right(cum, rng.random() * cum[-1])
        return j if j < N_CURVES else N_CURVES - 1

    def concurrencies(self) -> list[tuple[float, float, float]]:
        """(mean concurrency, tokens/s, mass) per bin, for display and tests."""
        return sorted((b.c, math.exp(b.mean), b.mass) for b in self.bins.values())

    # -- sharing through gossip (issue 14): a summary of the bins, and a belief built from one --
    def summary(self, max_bins: int = SUMMARY_BINS) -> tuple[tuple[int, float, float], ...]:
        """The bins as at most `max_bins` (concurrency bin, mass, mean log tps), ascending:
        what a route's statistics entry carries to other trackers. The mass is the one the
        fit weighs the bin by (faded by BIN_HALF_LIFE_SAMPLES). Past `max_bins`, adjacent
        bins are merged (mass-weighted), closest and lightest first (Ward's criterion,
        m1·m2/(m1 + m2)·Δbin²): the sparse low concurrencies, where the speed alone and
        the knee are read, survive longest."""
        out = sorted((key, b.mass * 0.5 ** ((self.samples - b.last) / BIN_HALF_LIFE_SAMPLES),
                      b.mean) for key, b in self.bins.items() if b.mass > 1e-9)
        while len(out) > max_bins:
            i = min(range(len(out) - 1), key=lambda k: _ward(out[k], out[k + 1]))
            (k1, m1, x1), (k2, m2, x2) = out[i], out[i + 1]
            m = m1 + m2
            out[i:i + 2] = [(round((k1 * m1 + k2 * m2) / m), m, (x1 * m1 + x2 * m2) / m)]
        return tuple(out)

    @classmethod
    def from_summary(cls, bins: Iterable[tuple[int, float, float]]) -> CurveBelief:
        """A belief whose samples are a summary's bins (another tracker's, or several merged):
        the prior of a route this tracker has measured less than its peers. Each bin's
        spread is taken as OBS_SIGMA (a summary carries none); the mass is capped at
        MAX_MASS."""
        kept = [(key, mass, mean) for key, mass, mean in bins if mass > 1e-9]
        total = sum(mass for _, mass, _ in kept)
        scale = MAX_MASS / total if total > MAX_MASS else 1.0
        belief = cls()
        for key, mass, mean in kept:
            m = mass * scale
            belief.bins[key] = _Bin(m, mean, m * OBS_SIGMA * OBS_SIGMA,
                                    2.0 ** (key / BINS_PER_OCTAVE))
            belief.mass += m
        return belief


def _ward(a: tuple[int, float, float], b: tuple[int, float, float]) -> float:
    """What merging two bins costs: m1·m2 / (m1 + m2) · (bin distance)²."""
    return a[1] * b[1] / (a[1] + b[1]) * (b[0] - a[0]) ** 2
