"""The oracle: a policy handed the simulator's ground truth, and the best split it should find.

It scores a route by what sending the request there adds to the mesh's delivered tokens/s
right now, with the true speeds, batch sizes, slowdowns and failure rates: the new request's
own rate minus what its batch neighbours lose (zero when it would have to queue), plus a small
tie-break on the request's own expected speed, queueing included (which decides among routes
that are all saturated: shortest expected delay). For concave saturation curves this greedy
marginal rule keeps a closed loop at the best split, which `best_split` computes exactly.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar

from ..policies import EXPLOIT, Arm, DecisionMode, Outcome
from ..routes import Route
from .model import NodeSpec

if TYPE_CHECKING:
    from .engine import Simulator

# A decision is "good" when its route's score is within 5 % of the oracle's best
# (docs/benchmarks.md, "Learning quality": the re-convergence metric).
GOOD_WITHIN = 0.05
# Weight of the request's own expected speed beside the tokens/s it adds: a tie-break that
# only decides among routes that are all saturated (where it is shortest expected delay).
TIE_WEIGHT = 0.05


class OraclePolicy:
    """Picks the route that adds the most delivered tokens/s, knowing the ground truth."""

    name: ClassVar[str] = "oracle"

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim

    def choose(self, arms: Sequence[Arm], now: float,
               rng: random.Random) -> tuple[int, DecisionMode]:
        """The arm whose route scores best for the current request."""
        req = self.sim.current
        tokens = req.tokens if req is not None else 1
        return best_route([a.route for a in arms], self.sim, tokens), EXPLOIT

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """The oracle needs no learning."""


FIXED_SPLIT = "fixed-split"


class FixedSplitPolicy:
    """The best fixed split (`best_split`) of a closed loop's clients over single-node
    routes: client c always goes to the same node, the first `split[0]` clients to the
    first node, and so on (issue 31's reference for slot-limited meshes)."""

    name: ClassVar[str] = FIXED_SPLIT

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        split, _ = best_split(sim.scenario.nodes, sim.scenario.clients)
        self.node_of = [sim.scenario.nodes[i].node_id
                        for i, n in enumerate(split) for _ in range(n)]

    def choose(self, arms: Sequence[Arm], now: float,
               rng: random.Random) -> tuple[int, DecisionMode]:
        """The arm whose route runs on the current client's node."""
        req = self.sim.current
        client = req.client if req is not None else 0
        node = self.node_of[client % len(self.node_of)]
        for i, arm in enumerate(arms):
            if arm.route.node_ids == (node,):
                return i, EXPLOIT
        return 0, EXPLOIT

    def observe(self, signature: str, outcome: Outcome, now: float) -> None:
        """A fixed split learns nothing."""


def best_route(routes: Sequence[Route], sim: Simulator, tokens: int) -> int:
    """Index of the route with the best score (the first on a tie)."""
    scores = [sim.gain(r, tokens) for r in routes]
    return scores.index(max(scores))


def gain_score(sim: Simulator, route: Route, tokens: int) -> float:
    """Expected delivered tokens/s the mesh gains now by sending the request on `route`,
    plus TIE_WEIGHT × the request's own expected delivered speed."""
    compute, hop_s, latency_s, fail_p = sim.route_truth(route)
    nodes = route.node_ids
    ok_p = 1.0 - fail_p
    req = sim.current
    if sim.conversing and req is not None:
        # Knowing every cache: the prompt's uncached prefill is paid before any token.
        latency_s += sim.prefill_s(route, req.prompt)
    if not sim.can_start(nodes):
        wait = max(sim.expected_wait_s(n) for n in nodes)
        per_token = sum(c * sim.nodes[n].spec.slowdown(sim.nodes[n].spec.slots)
                        for n, c in zip(nodes, compute, strict=True)) + hop_s
        return TIE_WEIGHT * ok_p * tokens / (wait + latency_s + tokens * per_token)
    extra = frozenset(nodes)
    per_token = sim.per_token_s(nodes, compute, hop_s, extra)
    # Conversations: its own delivered rate, first token included.
    gain = (ok_p * tokens / (latency_s + tokens * per_token) if sim.conversing
            else ok_p / per_token)
    for req in {r for n in nodes for r in sim.nodes[n].running}:
        if req.rate <= 0:
            continue
        before = sim.per_token_s(req.nodes, req.compute_s, req.hop_s)
        after = sim.per_token_s(req.nodes, req.compute_s, req.hop_s, extra)
        gain -= (1.0 - req.fail_p) * (1.0 / before - 1.0 / after)
    own = tokens / (latency_s + tokens * per_token)
    return gain + TIE_WEIGHT * ok_p * own


def best_split(nodes: Sequence[NodeSpec], clients: int) -> tuple[list[int], float]:
    """The best way to spread `clients` closed-loop requests over single-node routes: how
    many on each and the total tokens/s, maximising Σ throughput(n) exactly (greedy on the
    marginal gains, optimal because every node's throughput curve is concave)."""
    split = [0] * len(nodes)
    for _ in range(clients):
        gains = [n.throughput(k + 1) * (1 - n.fail_rate) - n.throughput(k) * (1 - n.fail_rate)
                 for n, k in zip(nodes, split, strict=True)]
        split[gains.index(max(gains))] += 1
    total = sum(n.throughput(k) * (1 - n.fail_rate) for n, k in zip(nodes, split, strict=True))
    return split, total
