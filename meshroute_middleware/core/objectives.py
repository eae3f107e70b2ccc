"""Per-request objectives (issue 26): what a request asks its route to be best at.

- `throughput` (the default): the policy's own choice, by delivered tokens/s; a request
  without an objective is decided exactly as before objectives existed.
- `ttft`: the least expected time to first token (on the mesh `policies/ttft.py`; in a
  provider chain the first-token axis of the scoring: core/providers/router.py).
- `cost`: the lowest price (mesh routes are free), then speed. On the mesh alone every route
  is free, so it decides as `throughput` does.
"""

from __future__ import annotations

from typing import Final, Literal

from .errors import MeshRouteError

Objective = Literal["throughput", "ttft", "cost"]
THROUGHPUT: Final = "throughput"
TTFT: Final = "ttft"
COST: Final = "cost"
OBJECTIVES: tuple[Objective, ...] = (THROUGHPUT, TTFT, COST)
DEFAULT_OBJECTIVE: Objective = THROUGHPUT


class InvalidObjectiveError(MeshRouteError, ValueError):
    """A request's objective is not one of OBJECTIVES (HTTP 400 `invalid_objective`)."""


def parse_objective(value: object, where: str) -> Objective:
    """The objective `value` names; InvalidObjectiveError naming the allowed values."""
    for objective in OBJECTIVES:
        if value == objective:
            return objective
    shown = repr(value)[:40] if isinstance(value, str) else f"a JSON {_json_kind(value)}"
    raise InvalidObjectiveError(f"{where} must be one of {', '.join(map(repr, OBJECTIVES))}, "
                                f"got {shown}")


def _json_kind(value: object) -> str:
    """What kind of JSON value a non-string is (an objective is never echoed beyond 40
    characters, nor a structure at all)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    return "array" if isinstance(value, list) else "object"
