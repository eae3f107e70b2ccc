"""One request on its way down a provider chain: what each of its attempts needs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from starlette.types import Scope

from meshroute_middleware.chat.attempts import Attempts, Exchange
from meshroute_middleware.chat.providers.tally import Tally
from meshroute_middleware.core.objectives import DEFAULT_OBJECTIVE, Objective


@dataclass(slots=True, eq=False)
class ChainRequest:
    """The chain's per-request state: the exchange, the decoded body and its token estimate,
    the session, the budgets (the chain's own from `started`, the request's `deadline`), the
    tally of routes tried, every mesh `Attempts` opened on the way and the request's
    objective (its mesh entries choose by it too)."""

    ex: Exchange
    payload: dict[str, Any]
    reserve: int  # tokens a key attempt reserves
    context_need: int  # tokens of context the request needs
    session: str | None
    started: float  # clock() when the chain began: the ProviderRouter's total budget
    tally: Tally
    opened: list[Attempts]
    objective: Objective = DEFAULT_OBJECTIVE
    prompt: int = 0  # the prompt's estimated tokens (core/providers/tokens.py)
    asked: int | None = None  # the answer's `max_tokens` the client asked for, if any

    @property
    def deadline(self) -> float:
        """The loop time the request must be done by (`--request-timeout`)."""
        return self.opened[0].deadline

    def time_to_deadline(self) -> float:
        """Seconds left before the request's deadline (never negative)."""
        return max(0.0, self.deadline - asyncio.get_running_loop().time())


def header(scope: Scope, name: bytes) -> str | None:
    """A request header's value, or None."""
    for k, v in scope.get("headers", ()):
        if k == name:
            return str(v.decode("latin-1"))
    return None
