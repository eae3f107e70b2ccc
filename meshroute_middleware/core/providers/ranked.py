"""A ranked provider or mesh route (`Scored`) and the orders a ranking puts routes in: by
score, by price, the pin or the session's route first; which routes have what a request needs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .chain import Candidate

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
