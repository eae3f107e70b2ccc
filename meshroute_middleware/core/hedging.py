"""Hedged first tokens (issue 34), the pure part: when to hedge and how many hedges a gateway
may spend.

A hedge starts the next ranked route beside an attempt whose first byte has not come after
`HedgeAfter` (a quantile of that route's learned first-byte times, `p95`, or a fixed delay,
`250ms`); a hedge without its first byte after its own route's delay gets the route after
it started too, up to MAX_RACERS routes racing; the first to send a byte wins, the others
are cancelled (chat/hedge.py).
Hedges are capped: `HedgeCap` lets at most `max_share` of the requests it sees hedge, so a
gateway never spends more than that share on extra upstream requests.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from .errors import MeshRouteError

DEFAULT_MAX_SHARE = 0.05  # hedges per request at most (issue 34: "≤ 5 % of requests")
# hedges the cap's credit holds at most: a hedge of an unlucky fast request just before a
# slow one still leaves credit for the slow one (over n requests: ≤ share × n hedges)
BURST = 2.0
# a quantile hedge waits at least this many times the route's median first byte: a hedge
# started at d answers at ~d + the median, so on a tight route (20 ms ± 20 %) hedging the
# fast requests just past p95 wins nothing and spends the cap (5 % of requests pass p95 by
# definition: the whole default cap) before the slow ones come
MEDIAN_FACTOR = 2.0
# routes racing for one request's first byte at most: the first and two hedges. A third
# route helps when a tail is common enough that first and hedge are both slow (1 in 10
# slow: 1 % of requests; docs/benchmarks/reliability.md r1); a fourth would win at most
# the 0.1 % all three slow, for a whole request more each time, and the cap's credit (at
# most BURST = 2 hedges) could not pay for it anyway
MAX_RACERS = 3
_QUANTILE = re.compile(r"p(\d{1,2}(?:\.\d+)?)")
_DELAY = re.compile(r"(\d+(?:\.\d+)?)(ms|s)")


class HedgeSyntaxError(MeshRouteError, ValueError):
    """A hedge setting that is neither `pNN` nor a delay (`250ms`, `1.5s`) nor `off`."""


@dataclass(frozen=True, slots=True)
class HedgeAfter:
    """When an attempt without its first byte gets a hedge: after the `quantile` of its
    route's learned first-byte times (a cold route is not hedged), or after `fixed_s`."""

    quantile: float | None = None
    fixed_s: float | None = None

    def delay_s(self, learned: float | None, median: float | None = None) -> float | None:
        """Seconds to wait before hedging, given the route's learned quantile and median
        (None: cold): a fixed delay as set; a quantile, at least MEDIAN_FACTOR × the median."""
        if self.fixed_s is not None:
            return self.fixed_s
        if learned is None or median is None:
            return learned
        return max(learned, MEDIAN_FACTOR * median)

    def __str__(self) -> str:
        if self.fixed_s is not None:
            return f"{self.fixed_s * 1000:g}ms"
        return f"p{(self.quantile or 0) * 100:g}"


def parse_hedge_after(text: str) -> HedgeAfter | None:
    """`p95` (a quantile, 0 < q < 100), `250ms` or `1.5s` (a delay > 0), `off` (None)."""
    value = text.strip().lower()
    if value in ("", "off", "none", "no"):
        return None
    if (m := _QUANTILE.fullmatch(value)) is not None and 0 < float(m[1]) < 100:
        return HedgeAfter(quantile=float(m[1]) / 100)
    if (m := _DELAY.fullmatch(value)) is not None and float(m[1]) > 0:
        return HedgeAfter(fixed_s=float(m[1]) / (1000 if m[2] == "ms" else 1))
    raise HedgeSyntaxError(f"hedge must be a quantile like 'p95', a delay like '250ms' or "
                           f"'1.5s', or 'off'; got {text!r}")


@dataclass(frozen=True, slots=True)
class HedgePlan:
    """Which requests hedge and when: a model's or chain's own `hedge` key (`by_name`; a
    mesh model's `[mesh.MODEL]`, a profile's chain `auto:NAME`, `auto` for `[routing]`'s),
    else the gateway's default (`--hedge-after`)."""

    default: HedgeAfter | None = None
    by_name: Mapping[str, HedgeAfter | None] = field(default_factory=dict)
    max_share: float = DEFAULT_MAX_SHARE

    def __post_init__(self) -> None:
        if not 0 <= self.max_share <= 1:
            raise ValueError(f"hedge_max_share must be in [0, 1], got {self.max_share}")

    def for_name(self, name: str) -> HedgeAfter | None:
        """The hedge of requests for `name` (a mesh model, `auto`, `auto:NAME`)."""
        return self.by_name.get(name, self.default) if self.by_name else self.default

    @property
    def enabled(self) -> bool:
        """Whether any request may hedge."""
        return self.max_share > 0 and (self.default is not None
                                       or any(v is not None for v in self.by_name.values()))


class HedgeCap:
    """At most `max_share` of the requests seen may hedge: each request adds `max_share` of
    a hedge to a credit (empty at first, holding at most BURST), and a hedge spends one."""

    __slots__ = ("credit", "hedges", "max_share", "requests")

    def __init__(self, max_share: float = DEFAULT_MAX_SHARE) -> None:
        self.max_share = max_share
        self.credit = 0.0
        self.requests = 0
        self.hedges = 0

    def seen(self) -> None:
        """A request that may hedge started."""
        self.requests += 1
        self.credit = min(BURST, self.credit + self.max_share)

    def may(self) -> bool:
        """Whether a hedge may start now."""
        return self.credit >= 1.0 - 1e-9

    def take(self) -> bool:
        """Whether a hedge may start now (it is counted if so)."""
        if not self.may():
            return False
        self.credit -= 1.0
        self.hedges += 1
        return True


def hedge_keys(doc: Mapping[str, object]) -> dict[str, HedgeAfter | None]:
    """The `hedge` keys of a config's provider tables, by the name a request asks for:
    `[profiles.NAME]` as `auto:NAME`, `[mesh.MODEL]` as `MODEL` (`[routing] hedge` is the
    gateway's default: app/settings.py). HedgeSyntaxError names the table of a bad one."""
    out: dict[str, HedgeAfter | None] = {}
    for table, prefix in (("profiles", "auto:"), ("mesh", "")):
        entries = doc.get(table, {})
        if not isinstance(entries, Mapping):
            continue
        for name, entry in entries.items():
            if isinstance(entry, Mapping) and "hedge" in entry:
                value = entry["hedge"]
                try:
                    if not isinstance(value, str):
                        raise HedgeSyntaxError(f"hedge must be a string, got {value!r}")
                    out[f"{prefix}{name}"] = parse_hedge_after(value)
                except HedgeSyntaxError as exc:
                    raise HedgeSyntaxError(f"[{table}.{name}] {exc}") from None
    return out
