"""A ranked provider or mesh route (`Scored`) and the orders a ranking puts routes in: by
score, by price, the pin or the session's route first; which routes have what a request needs."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .chain import Candidate, Resolution
from .keys import KeyGates

MeshServes = Callable[[str, frozenset[str]], bool]  # whether a mesh model has a route with them


@dataclass(frozen=True, slots=True)
class Scored:
    """A candidate with its axes and combined score (sampled when ranking, expected on display;
    None under `priority`, which ranks by the written order). Under the `ttft` objective
    `speed` is the first-token axis (scoring.first_token_score) and `score` is reliability ×
    that × headroom × rate limit."""

    candidate: Candidate
    score: float | None
    reliability: float
    speed: float
    intelligence: float
    price: float
    headroom: float
    rate_limit: float


class Ranked(list[Scored]):
    """A ranking, best first, and what became of the conversation's warm route
    (affinity.Verdict; None: no conversation, or the `priority` strategy)."""

    def __init__(self, ranked: Iterable[Scored] = (), affinity: str | None = None) -> None:
        super().__init__(ranked)
        self.affinity = affinity


def chain_view(res: Resolution, ranked: list[Scored], gates: KeyGates, now: float,
               objective: str) -> dict[str, Any]:
    """`GET /v1/routing/chain` of a ranking made on expected values; `position` is each
    route's 1-based place in the chain as written (`score` is None under `priority`, which
    tries routes by it)."""
    positions = {c.route: i for i, c in enumerate(res.candidates, 1)}
    chain = []
    for s in ranked:
        c = s.candidate
        keys = (gates.key_states(c.provider, c.model, now)
                if c.provider is not None and c.model is not None else [])
        chain.append({"route": c.route, "kind": "provider" if c.is_provider else "mesh",
                      "position": positions[c.route], "score": s.score,
                      "reliability": s.reliability, "speed": s.speed,
                      "intelligence": s.intelligence, "price": s.price,
                      "headroom": s.headroom, "rate_limit": s.rate_limit, "keys": keys})
    return {"model": res.model, "strategy": res.strategy, "objective": objective,
            "chain": chain}


def has_caps(candidate: Candidate, needs: frozenset[str],
             mesh_serves: MeshServes | None = None) -> bool:
    """Whether a route has every capability in `needs` (a provider model: as configured; a
    mesh model: as `mesh_serves` says, assumed when it is not given)."""
    if not needs:
        return True
    if candidate.model is not None:
        return needs <= candidate.model.capabilities
    return mesh_serves is None or mesh_serves(candidate.route, needs)


def by_score(s: Scored) -> float:
    """The sort key of a ranking by score: best first."""
    return -s.score if s.score is not None else 0.0


def by_price(s: Scored) -> tuple[float, float]:
    """The sort key under the `cost` objective: cheapest first (price axis 1 = free), then
    by score."""
    return (-s.price, by_score(s))


def move_first(ranked: list[Scored], route: str | None) -> list[Scored]:
    """The ranking with `route` moved to the front (unchanged when it is not in it)."""
    for i, s in enumerate(ranked):
        if s.candidate.route == route:
            return [s, *ranked[:i], *ranked[i + 1:]]
    return ranked
