"""What a request costs the mesh on a route (issue 31): its own tokens/s there, less what
its batch neighbours lose by its joining, all of it when it would queue (its marginal cost,
as a queueing-aware scheduler prices congestion); and the posterior's belief that it
queues."""

from __future__ import annotations

import bisect

from ..saturation import G_TABLE, KNEES, MAX_TABULATED, SLOWDOWNS, CurveBelief, g_at

# A request's score is its own expected tokens/s minus this share of what its batch
# neighbours lose by its joining (queueing beyond the knee counts as a loss too). 1 maximises
# a closed loop's total throughput, 0 is shortest expected delay; 0.5 measured best of
# {0.05, 0.23, 0.5, 0.67, 0.83, 0.99} on the tuning scenarios 5, 9, 10 and 11 (quick runs,
# seeds 1-2): 1 gives up latency under open-loop load (scenario 5 p95 +40 %), 0 overloads a
# saturating batch (scenario 10: 0.89 of the oracle against 0.99).
NEIGHBOUR_WEIGHT = 0.5
# A request that would queue (every slot its route's server announced taken) adds nothing
# to the mesh's throughput and delays every request behind it: it counts all its
# neighbours lose (its marginal cost, as a queueing-aware scheduler prices congestion),
# plus this share of its own speed, which ranks routes that are all full by their
# expected delay (the oracle's tie-break, core/sim/oracle.py). Only the announced slots
# say "full": a knee merely drawn from the posterior (a route silent on its slots, or one
# re-learnt after an outage) keeps the half weight (docs/benchmarks.md, "Slot-limited
# meshes and several trackers").
QUEUE_TIE = 0.05


def neighbours_loss(s1: float, curve: int, in_flight: int) -> tuple[float, float]:
    """(a request's own tokens/s, the tokens/s its `in_flight` neighbours lose by its
    joining) on a route whose saturation curve is `CURVES[curve]`."""
    n = in_flight
    if n < MAX_TABULATED:  # both g values tabulated: one row lookup (this is per decision)
        row = G_TABLE[curve]
        g_n, g_next = row[n], row[n + 1]
    else:
        g_n, g_next = g_at(curve, n), g_at(curve, n + 1)
    own = s1 * g_next
    return own, n * (s1 * g_n - own)


def gain(s1: float, curve: int, in_flight: int, full: bool = False) -> float:
    """A request's own tokens/s on a route running `in_flight` others (saturation curve
    `CURVES[curve]`), minus NEIGHBOUR_WEIGHT x the tokens/s those others lose; when it
    would queue (`full`: the route's announced slots all taken), minus all they lose,
    plus QUEUE_TIE x its own: its marginal cost to the mesh (zero past the knee)."""
    n = in_flight
    own, lost = neighbours_loss(s1, curve, n)
    if not n:
        return own
    if full:  # it waits, and delays every request behind it
        return own - lost + QUEUE_TIE * own
    return own - NEIGHBOUR_WEIGHT * lost


def queue_share(curve: CurveBelief | None, in_flight: int) -> float:
    """The posterior's probability that a request joining `in_flight` others on this route
    waits for a slot (its knee below in_flight + 1); 0 while nothing was measured."""
    if not in_flight:
        return 0.0
    if curve is None or curve.mass <= 0.0:
        return 0.0
    cum = curve.posterior()[0]  # cumulative over CURVES, knee-major
    k = bisect.bisect_left(KNEES, in_flight + 1) * len(SLOWDOWNS)
    return cum[k - 1] / cum[-1] if k else 0.0
