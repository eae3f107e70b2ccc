"""What a route can serve beyond plain chat (issue 25): the capability names and their rules.

A node declares `caps`, a provider model `capabilities`; a request needs some (an image part:
`vision`; tools: `tools`; a `json_schema` response format: `json_schema`; the embeddings and
completions endpoints: `embeddings`, `completions`). A route serves a request only when it has
every capability the request needs; a chain of hops has what every hop has.

Absent a declaration, a route is assumed to have DEFAULT_CAPS: what every route was sent before
capabilities existed (chat with tools and JSON schemas kept working for current users), never
what an old route cannot be expected to serve (images, embeddings, completions). docs/providers.md
explains the choice.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from .errors import MeshRouteError

VISION: Final = "vision"
TOOLS: Final = "tools"
JSON_SCHEMA: Final = "json_schema"
EMBEDDINGS: Final = "embeddings"
COMPLETIONS: Final = "completions"
CAPABILITIES: Final = (VISION, TOOLS, JSON_SCHEMA, EMBEDDINGS, COMPLETIONS)
DEFAULT_CAPS: Final = frozenset({TOOLS, JSON_SCHEMA})  # a route that declares none
NO_NEEDS: Final[frozenset[str]] = frozenset()
MAX_CAPS_CHARS: Final = 128  # a `caps` field longer than every name joined is hostile


class UnsupportedCapabilityError(MeshRouteError, ValueError):
    """No route of the model has a capability the request needs (HTTP 400)."""

    def __init__(self, model: str, missing: Iterable[str]) -> None:
        self.missing = tuple(sorted(missing))
        super().__init__(f"no route for model {model!r} supports "
                         f"{', '.join(self.missing)} (the request needs it)")


def parse_caps(value: object, where: str = "caps") -> frozenset[str]:
    """A list of capability names (or a comma-separated string) as a frozenset; ValueError
    naming the first unknown or malformed entry (its text cut short: it may be hostile)."""
    if isinstance(value, str):
        if len(value) > MAX_CAPS_CHARS:
            raise ValueError(f"{where} is longer than {MAX_CAPS_CHARS} characters")
        value = [v.strip() for v in value.split(",")] if value.strip() else []
    if not isinstance(value, list | tuple | frozenset | set):
        raise ValueError(f"{where} must be a list of capability names")
    if len(value) > len(CAPABILITIES):
        raise ValueError(f"{where} lists {len(value)} entries; there are only "
                         f"{len(CAPABILITIES)} capabilities")
    for name in value:
        if name not in CAPABILITIES:
            shown = repr(name)[:40]
            raise ValueError(f"{where}: unknown capability {shown} (known: "
                             f"{', '.join(CAPABILITIES)})")
    return frozenset(value)


def format_caps(caps: Iterable[str]) -> str:
    """The comma-separated form (`--caps`, the TXT record), in CAPABILITIES order."""
    have = set(caps)
    return ",".join(c for c in CAPABILITIES if c in have)


def lacks(have: frozenset[str], needs: frozenset[str]) -> frozenset[str]:
    """The capabilities of `needs` that `have` does not hold (empty: it can serve)."""
    return needs - have
