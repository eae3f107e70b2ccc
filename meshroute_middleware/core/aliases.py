"""Model aliases (issue 25): `[aliases]` maps the model names clients send (Claude Code's
`claude-sonnet-4-5`, Codex's `gpt-5-codex`) onto a chain, a mesh model or a provider model.

Keys are glob patterns (`fnmatch`: `*`, `?`, `[...]`, case-sensitive), tried in the order the
file lists them (TOML tables keep their order); the first match wins and applies once: an
alias's target is never looked up again, so no cycle can form.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from fnmatch import translate
from typing import Any

MAX_PATTERN_CHARS = 256
MAX_ALIASES = 1000


@dataclass(frozen=True, slots=True)
class Alias:
    """One `[aliases]` entry: the pattern a requested model matches and the model it means."""

    pattern: str
    target: str
    regex: re.Pattern[str] = field(compare=False, repr=False)

    @property
    def is_glob(self) -> bool:
        """Whether the pattern matches more than one name."""
        return any(c in self.pattern for c in "*?[")


@dataclass(frozen=True, slots=True)
class Aliases:
    """The aliases in file order; `resolve` gives the first match's target."""

    entries: tuple[Alias, ...] = ()

    def resolve(self, model: str) -> str | None:
        """The model `model` stands for, or None when no alias matches it."""
        for alias in self.entries:
            if alias.regex.match(model):
                return alias.target
        return None

    def __bool__(self) -> bool:
        return bool(self.entries)


NO_ALIASES = Aliases()


def parse_aliases(table: Mapping[str, Any], where: str = "[aliases]") -> Aliases:
    """`[aliases]` as Aliases; ValueError naming the offending key."""
    if not isinstance(table, Mapping):
        raise ValueError(f"{where} must be a table of \"pattern\" = \"model\"")
    if len(table) > MAX_ALIASES:
        raise ValueError(f"{where} holds {len(table)} entries (at most {MAX_ALIASES})")
    entries = []
    for pattern, target in table.items():
        if not isinstance(pattern, str) or not pattern.strip() or (
                len(pattern) > MAX_PATTERN_CHARS) or not pattern.isprintable():
            raise ValueError(f"{where}: {str(pattern)[:40]!r} is not a model name pattern")
        if not isinstance(target, str) or not target.strip() or target != target.strip():
            raise ValueError(f"{where}: {pattern!r} must name a model (a non-empty string)")
        entries.append(Alias(pattern, target, re.compile(translate(pattern))))
    return Aliases(tuple(entries))
