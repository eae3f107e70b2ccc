"""What a re-try costs: the expected length of a request's answer, from its `max_tokens`.

Thompson sampling re-tries a route that looks slower because the route may have become
faster since it was last measured (the random-walk drift of `thompson`). Such a re-try is
worth the same whichever request carries it, but costs in proportion to that request's
answer: a 64-token answer on a route 15 % slower loses an eighth of what a 512-token one
does. A gateway does not know the answer's length in advance, only the bound the client set
(the body's `max_tokens`, often absent, often a fixed generous cap). So the policy learns,
per class of bound (none, or its power of two), the mean length of the answers that came
back, and spends the drift's variance where answers are short: a request's draw uses
`w = ê⁻ᵖ / mean over requests of ê⁻ᵖ` times the drift, ê the expected length of its class.
The weights average one over the traffic, so the share of decisions that re-try stays about
what it was; they are all one when no bound tells the classes apart (no `max_tokens`
anywhere, or the same cap everywhere), so the policy then behaves exactly as before.
Pure: no clock, no randomness.
"""

from __future__ import annotations

from ..contracts.limits import MAX_ANSWER_TOKENS

# How sharply the drift is moved toward short answers: w ∝ (expected length)^-POWER. 1 is
# the cost ratio itself; the draws' tails are steep (Gaussian), so more contrast is needed
# for the re-tries to actually land on the short answers (tuning seeds: docs/benchmarks.md).
# Of {2, 3, 4} on the tuning seeds, 3: scenario 2 went from 0.9930 to 0.9955 (4: 0.9959, but
# 8-recovery found its recovered route later; 2: 0.9949 on seeds 1-8).
POWER = 3.0
W_MIN, W_MAX = 0.125, 8.0  # a request's weight stays within these
MIN_LENGTHS = 5.0  # answers of a class before its own mean is trusted
LENGTH_WEIGHT = 100.0  # running mean over about this many answers per class
RENORM_EVERY = 32  # outcomes between recomputations of the traffic's mean weight
FREQ_CAP = 2000.0  # class counts are halved beyond this (older traffic fades)
OVERALL = -1  # the class key of all answers


def bound_class(max_tokens: int | None) -> int:
    """The class of a request's bound: 0 for none, else its power of two (bounds above
    MAX_ANSWER_TOKENS are its class)."""
    if max_tokens is None or max_tokens <= 0:
        return 0
    return min(max_tokens, MAX_ANSWER_TOKENS).bit_length()


class AnswerLengths:
    """Per class of `max_tokens`, the running mean answer length and how often it comes."""

    __slots__ = ("_classes", "_norm", "_since", "_weights")

    def __init__(self) -> None:
        # class -> [mean completion tokens, weight of that mean, decayed frequency]
        self._classes: dict[int, list[float]] = {}
        self._norm: float | None = None  # mean of expected^-POWER over the traffic
        self._weights: dict[int, float] = {}  # per class, as of the last recomputation
        self._since = 0

    def add(self, max_tokens: int | None, completion_tokens: int) -> None:
        """Count one finished request of this bound; `completion_tokens` > 0 for an answer
        (a failure counts toward the class's frequency only)."""
        keys = (bound_class(max_tokens), OVERALL)
        for key in keys:
            entry = self._classes.get(key)
            if entry is None:
                entry = self._classes[key] = [0.0, 0.0, 0.0]
            entry[2] += 1.0
            if completion_tokens > 0:
                entry[1] = min(entry[1] + 1.0, LENGTH_WEIGHT)
                entry[0] += (completion_tokens - entry[0]) / entry[1]
        self._since += 1
        if self._since >= RENORM_EVERY:
            self._renorm()

    def expected(self, max_tokens: int | None) -> float | None:
        """Expected answer length of a request with this bound (None while nothing is
        known): its class's mean once known, else the overall mean capped at the bound."""
        overall = self._classes.get(OVERALL)
        if overall is None or overall[1] <= 0.0:
            return None
        return self._expected(bound_class(max_tokens), max_tokens, overall[0])

    def _expected(self, key: int, max_tokens: int | None, overall: float) -> float:
        entry = self._classes.get(key)
        if entry is not None and entry[1] >= MIN_LENGTHS:
            return max(entry[0], 1.0)
        if max_tokens is not None and max_tokens > 0:
            return max(min(float(min(max_tokens, MAX_ANSWER_TOKENS)), overall), 1.0)
        return max(overall, 1.0)

    def _renorm(self) -> None:
        self._since = 0
        overall = self._classes.get(OVERALL)
        if overall is None or overall[1] <= 0.0:
            return
        total = acc = 0.0
        costs: dict[int, float] = {}
        for key, entry in self._classes.items():
            if key == OVERALL:
                continue
            # a class's bounds run from 2**(key-1) to 2**key - 1: take the upper end
            bound = (1 << key) - 1 if key else None
            costs[key] = cost = self._expected(key, bound, overall[0]) ** -POWER
            total += entry[2]
            acc += entry[2] * cost
        if len(costs) > 1 and total > 0.0:
            norm = self._norm = acc / total
            self._weights = {key: _clamp(cost / norm) for key, cost in costs.items()}
        else:  # one class: nothing tells the requests apart
            self._norm, self._weights = None, {}
        if overall[2] > FREQ_CAP:
            for entry in self._classes.values():
                entry[2] *= 0.5

    def weight(self, max_tokens: int | None) -> float:
        """The share of the drift variance a request with this bound draws with."""
        norm = self._norm
        if norm is None:
            return 1.0
        w = self._weights.get(bound_class(max_tokens))
        if w is not None:
            return w
        expected = self.expected(max_tokens)  # a class not seen at the last recomputation
        return 1.0 if expected is None else _clamp(expected ** -POWER / norm)


def _clamp(w: float) -> float:
    return W_MIN if w < W_MIN else W_MAX if w > W_MAX else w
