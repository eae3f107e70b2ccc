"""How the demo shows itself: a table refreshed in place on a terminal, lines in a pipe."""

from __future__ import annotations

import sys
import time
from typing import Any

from meshroute_middleware.app.demo.mesh import MODELS, LiveNode, route_true_tps
from meshroute_middleware.app.demo.providers import CHAIN_MODEL, ChainWatch
from meshroute_middleware.app.demo.tally import MARKS, Tally

BOLD, DIM, RESET = "\x1b[1m", "\x1b[2m", "\x1b[0m"
# The prefix-cache markers in colour: warm green, partial yellow, cold dim.
_MARK_COLOURS = {MARKS["warm"]: "\x1b[32m", MARKS["partial"]: "\x1b[33m", MARKS["cold"]: DIM}
COLOURS = {"proven": "\x1b[32m", "unsampled": "\x1b[90m", "stale": "\x1b[35m",
           "decayed": "\x1b[33m"}
COOLING = "\x1b[33m"
ROUTE_WIDTH = 36


def table(gateway: Any, nodes: dict[str, LiveNode], colour: bool,
          chain: ChainWatch | None = None) -> list[str]:
    """Every model's candidate routes: learned (the policy's estimate at one request) against
    true tok/s, share, samples, status; then the provider chain, when it runs."""
    doc = gateway.router.routing_table()["models"]
    lines = [f"  {'route':<{ROUTE_WIDTH}} {'learned':>8} {'true':>7} {'share':>16} "
             f"{'running':>7} {'samples':>7}  status"]
    for model in MODELS:
        lines.append(f"  {BOLD if colour else ''}{model}{RESET if colour else ''}")
        entry = doc.get(model)
        if not entry or not entry["candidates"]:
            lines.append("    (no route)")
            continue
        lines += [_row(row, nodes, colour) for row in entry["candidates"]]
    if chain is not None:
        rows = chain.rows(time.time())
        if colour:
            rows[0] = BOLD + rows[0] + RESET
            rows = [row.replace(" cooldown ", f" {COOLING}cooldown{RESET} ") for row in rows]
        lines += rows
    return lines


def _row(row: dict[str, Any], nodes: dict[str, LiveNode], colour: bool) -> str:
    route = "→".join(f"{h['node_id']}[{h['start_layer']}-{h['end_layer']}]"
                     for h in row["hops"])
    # The policy's own estimate where it keeps one (thompson's curve: it moves as soon as a
    # change is detected), else the shared decayed mean, which keeps a route's old speed
    # while the policy sends it nothing.
    learned = row.get("estimate_tps")
    if learned is None:
        learned = row["tps"]
    tps = "—" if learned is None else f"{learned:.1f}"
    true = route_true_tps(row["hops"], nodes)
    bar = "█" * round(row["share"] * 10)
    status = row["status"]
    if colour:
        status = COLOURS.get(status, "") + status + RESET
    return (f"    {route:<{ROUTE_WIDTH - 2}} {tps:>8} {true:>7.1f} {bar:<10}"
            f"{row['share']:>5.0%} {row['in_flight']:>7} {row['samples']:>7}  {status}")


def best_true_tps(gateway: Any, nodes: dict[str, LiveNode]) -> dict[str, float]:
    """Per model, the true tok/s of its truly fastest candidate route right now."""
    doc = gateway.router.routing_table()["models"]
    return {model: max((route_true_tps(r["hops"], nodes) for r in entry["candidates"]),
                       default=0.0) for model, entry in doc.items()}


class Live:
    """Redraws the screen in place (ANSI), like top."""

    def __init__(self, policy: str) -> None:
        self._policy = policy
        self.chain: ChainWatch | None = None

    def show(self, gateway: Any, nodes: dict[str, LiveNode], tally: Tally) -> None:
        """Redraw the whole view."""
        chain = f", chain {CHAIN_MODEL}" if self.chain else ""
        out = ["\x1b[H\x1b[J", f"{BOLD}meshroute demo{RESET} {DIM}— models "
               f"{', '.join(MODELS)}{chain}, policy {self._policy}, up {tally.elapsed_s():4.0f}s   "
               f"(Ctrl-C to stop){RESET}", "", *table(gateway, nodes, True, self.chain), "",
               f"  requests ok {tally.ok}   failed {tally.failed}   delivered "
               f"{tally.tokens_per_s():6.1f} tok/s (all clients, 10 s window)", _turns(tally), "",
               f"  {DIM}events:{RESET}"]
        out += [f"    {_fresh(at, line)}" for at, line in tally.events[-8:]] or ["    —"]
        out += ["", f"  {DIM}last requests (mode, prefix cache, route):{RESET}",
                *(f"    {_coloured(line)}" for line in tally.last)]
        sys.stdout.write("\n".join(out) + "\n")
        sys.stdout.flush()

    def event(self, line: str) -> None:
        """Events show in the next redraw."""

    def close(self, gateway: Any, nodes: dict[str, LiveNode], tally: Tally) -> None:
        """Leave the last table on screen."""


def _coloured(line: str) -> str:
    """A last-requests line with its cache marker in colour."""
    for mark, colour in _MARK_COLOURS.items():
        if mark in line:
            return line.replace(mark, f"{colour}{mark}{RESET}", 1)
    return line


def _turns(tally: Tally) -> str:
    """The conversations' line: how many returning turns found their prefix warm."""
    if not tally.turns:
        return f"  {DIM}conversations: no returning turn yet{RESET}"
    return (f"  conversations: {tally.turns} returning turns, {tally.warm_turns} warm "
            f"({tally.warm_turns / tally.turns:.0%}) {DIM}● warm ◐ partial ○ cold{RESET}")


def _fresh(at: float, line: str) -> str:
    """An event of the last five seconds in bold yellow."""
    return f"\x1b[1;33m{line}{RESET}" if time.monotonic() - at < 5.0 else line


class Plain:
    """A status line and the table every few seconds, events as they happen (logs, pipes)."""

    def __init__(self, policy: str, every_s: float = 5.0) -> None:
        self._next, self._every_s = 0.0, every_s
        self.chain: ChainWatch | None = None

    def show(self, gateway: Any, nodes: dict[str, LiveNode], tally: Tally) -> None:
        """Print the status and the table when it is time."""
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self._every_s
        print(f"[{tally.elapsed_s():5.0f}s] ok {tally.ok} failed {tally.failed} "
              f"delivered {tally.tokens_per_s():.1f} tok/s; conversation turns "
              f"{tally.turns}, warm {tally.warm_turns}", flush=True)
        print("\n".join(table(gateway, nodes, False, self.chain)), flush=True)

    def event(self, line: str) -> None:
        """Print a mesh event at once."""
        print(f"event {line}", flush=True)

    def close(self, gateway: Any, nodes: dict[str, LiveNode], tally: Tally) -> None:
        """Print the final status and table."""
        self._next = 0.0
        self.show(gateway, nodes, tally)
