"""The /v1/routing document: per model, its candidates with their statistics and the traffic
share each gets (display only: nothing here runs on a request's path)."""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from .capabilities import CAPABILITIES
from .policies import Arm, Policy

if TYPE_CHECKING:
    from .router import Router

ShareBasis = Literal["policy", "recent", "sampled"]  # how /v1/routing's shares were computed
RECENT_ATTEMPTS = 256  # attempts per model behind the 'recent' traffic shares
# ... the newest weighted most: an attempt counts half after this many newer ones, so the
# shown split follows a change within a few dozen attempts, not 256.
RECENT_HALF_LIFE = 32
_RECENT_WEIGHTS = [0.5 ** (age / RECENT_HALF_LIFE) for age in range(RECENT_ATTEMPTS)]
MIN_RECENT_FOR_SHARES = 32
SHARE_DRAWS = 400  # Monte-Carlo draws behind one model's 'sampled' shares
TABLE_SHARE_DRAWS = 4000  # draws for a whole table, split over its models (issue 11)
MIN_SHARE_DRAWS = 10


def routing_table(router: Router, model: str | None = None) -> dict[str, Any]:
    """The /v1/routing document: config and, per model, epoch and candidate table."""
    models = router.models() if model is None else [model]
    now = router.clock()
    # A bounded draw budget per table: 3,000 models at 400 draws each blocked the loop
    # for seconds; a one-model table keeps the full 400.
    draws = max(MIN_SHARE_DRAWS, min(SHARE_DRAWS, TABLE_SHARE_DRAWS // max(1, len(models))))
    out: dict[str, Any] = {}
    for name in models:
        topo = router.topology.model(name)
        arms = router.arms(name, now)
        shares, basis = traffic_shares(router, arms, draws) if arms else ([], "policy")
        out[name] = {"epoch": topo.epoch if topo else 0, "share_basis": basis,
                     "candidates": _table(router.policy, arms, shares)}
    return {"config": router.config.to_dict(), "models": out}


def traffic_shares(router: Router, arms: Sequence[Arm],
                   draws: int = SHARE_DRAWS) -> tuple[list[float], ShareBasis]:
    """Shares and their basis: 'policy' (closed form), 'recent' (what the last attempts
    did: a load-aware policy's next pick depends on what is in flight, so one snapshot
    would say 100 % for whichever route is idle) or 'sampled' (Monte Carlo, cold)."""
    exact = getattr(router.policy, "shares", None)
    if exact is not None:
        return list(exact(arms)), "policy"
    recent = router._recent.get(arms[0].route.model) if arms else None
    if recent is not None and len(recent) >= MIN_RECENT_FOR_SHARES:
        weights: dict[str, float] = {}
        # newest first; the deque holds at most RECENT_ATTEMPTS
        for signature, w in zip(reversed(recent), _RECENT_WEIGHTS, strict=False):
            weights[signature] = weights.get(signature, 0.0) + w
        total = sum(weights.values())
        return [weights.get(a.signature, 0.0) / total for a in arms], "recent"
    if len(arms) == 1:
        return [1.0], "sampled"
    return estimate_shares(router.policy, arms, router.clock(), draws), "sampled"


def estimate_shares(policy: Policy, arms: Sequence[Arm], now: float,
                    draws: int = 400) -> list[float]:
    """Monte-Carlo traffic shares for policies without a closed form (display only)."""
    rng = random.Random(0x5EED)
    counts = [0] * len(arms)
    for _ in range(draws):
        counts[policy.choose(arms, now, rng)[0]] += 1
    return [c / draws for c in counts]


def _table(policy: Policy, arms: Sequence[Arm],
           shares: Sequence[float]) -> list[dict[str, Any]]:
    best = max((a.view.tps or 0.0 for a in arms if a.proven), default=0.0)
    # The policy's own current estimate (thompson: its curve's s1), where it keeps one.
    estimate: Callable[[str], float | None] = getattr(
        policy, "estimate", lambda _signature: None)
    return [_row(a, best, s, estimate(a.signature))
            for a, s in zip(arms, shares, strict=True)]


def _row(arm: Arm, best_tps: float, share: float, estimate: float | None) -> dict[str, Any]:
    v = arm.view
    return {
        "signature": arm.signature,
        "hops": [{"node_id": h.node.node_id, "start_layer": h.start_layer,
                  "end_layer": h.end_layer} for h in arm.route.hops],
        "head": arm.route.head.node_id,
        "caps": [c for c in CAPABILITIES if c in arm.route.caps],  # what every hop serves
        "tps": v.tps,
        "prior_tps": arm.prior_tps,
        "estimate_tps": estimate,
        "coefficient": (v.tps / best_tps) if (v.tps is not None and best_tps > 0) else None,
        "share": share,
        "samples": v.count,
        "weight": v.mass,
        "status": v.status,
        "ttfb_ms": None if v.ttfb_s is None else v.ttfb_s * 1000.0,
        "successes": v.ok,
        "failures": v.fail,
        "in_flight": arm.in_flight,
        "slots": arm.route.slots,  # its narrowest hop's announced batch (None: unsaid)
        "origins": v.origins,
        "last_error": v.last_error or None,
    }
