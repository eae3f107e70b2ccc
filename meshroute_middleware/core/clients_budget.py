"""Per-client limits, budgets and the usage ledger (issue 24), decided on plain rows.

Windows (the provider key gates' own, core/providers/keys.py, reused):
- `rpm` and `tpm` are SLIDING 60-second windows in 1-second buckets; a request counts when it
  is admitted, its tokens when they are known (`settle`); until then its estimate counts
  against `tpm` and `daily_tokens` as "in flight".
- `daily_tokens` (prompt + completion) is the current UTC day; `monthly_usd` the current UTC
  calendar month, priced from the provider models' `price_in` / `price_out` (USD per million
  tokens; mesh routes are free). Each admitted request reserves its worst case while in
  flight (tokens: its prompt estimate plus its completion maximum; USD: those priced at the
  dearest route it may take), and settles to what it used when it ends (issue 32): a budget
  refuses a request whose worst case, with what was spent and what is in flight, would pass
  it; the refusal lasts until the window resets.

The ledger: one row per (client, route, UTC day): requests, prompt and completion tokens, USD
cost and errors. Rows are `Snapshot` rows like the key gates' (state/limits.py stores them):
section `clients` (name: the client, key 0) and section `usage` (name `<client> <route>`,
key: the UTC day number). A store loads the rows one decision reads into a fresh
`ClientGates`, decides here, and writes back the rows it changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .clients import Client
from .providers.keys import Refusal, RowName, Snapshot
from .providers.windows import DAY_S, Window, frees, month_index, month_start

CLIENTS, USAGE = "clients", "usage"  # the two sections of rows
SECTIONS = (CLIENTS, USAGE)
RATE_REASONS = ("rpm", "tpm")  # 429 client_rate_limited; the others: 429 budget_exceeded
BUDGET_REASONS = ("daily_tokens", "monthly_usd")
NO_ROUTE = "none"  # the ledger's route of a request no route answered
MINUTE_S = 60.0


class Admission(NamedTuple):
    """A client's request let in: its estimate counts in flight until settled. (A tuple:
    one is made per request, and a frozen dataclass's fields are each set by a call.)"""

    id: int
    client: str
    tokens: int
    usd: float = 0.0  # the worst case held against monthly_usd until settled


class Spent(NamedTuple):
    """What one request used, as its answer said (or as estimated); a tuple, as Admission."""

    route: str  # the ledger's route: `provider/model`, a mesh model, or NO_ROUTE
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float
    error: bool
    cached_tokens: int = 0  # of prompt_tokens: read from the provider's cache (issue 35)
    cache_write_tokens: int = 0  # of prompt_tokens: written to the provider's cache


@dataclass(slots=True)
class _ClientRow:
    window: Window = field(default_factory=Window)
    month: int = -1  # year * 12 + month - 1, UTC
    month_usd: float = 0.0
    inflight_usd: dict[int, float] = field(default_factory=dict)  # admission id -> USD held

    def roll(self, now: float) -> None:
        """The window's roll, and with it (once per second, Window's rule) the USD held by
        reservations that expired and a past month's spend."""
        if not self.window.roll(now):
            return
        if len(self.inflight_usd) > len(self.window.inflight):  # expired with its tokens
            held = self.window.inflight
            self.inflight_usd = {i: v for i, v in self.inflight_usd.items() if i in held}
        month = month_index(now)
        if month != self.month:
            self.month, self.month_usd = month, 0.0


def day_of(now: float) -> int:
    """The UTC day number of `now` (the ledger's and the daily budget's day)."""
    return int(now // DAY_S)


def usage_row(client: str, route: str, day: int) -> RowName:
    return (USAGE, f"{client} {route}", day)


def client_row(client: str) -> RowName:
    return (CLIENTS, client, 0)


def cost_usd(prompt_tokens: int, completion_tokens: int,
             price: tuple[float | None, float | None] | None, cached_tokens: int = 0,
             cache_write_tokens: int = 0,
             cache_price: tuple[float, float] | None = None) -> float:
    """USD of one answer at (price_in, price_out) per million tokens; None prices are free.
    Of the prompt, `cached_tokens` are priced at `cache_price`'s first (cache reads) and
    `cache_write_tokens` at its second (cache writes), the rest at price_in (issue 35);
    no `cache_price`: price_in for all."""
    if price is None:
        return 0.0
    price_in, price_out = price[0] or 0.0, price[1] or 0.0
    cached = min(max(0, cached_tokens), max(0, prompt_tokens))
    written = min(max(0, cache_write_tokens), max(0, prompt_tokens) - cached)
    read_price, write_price = cache_price or (price_in, price_in)
    return ((prompt_tokens - cached - written) * price_in + cached * read_price
            + written * write_price + completion_tokens * price_out) / 1e6


class ClientGates:
    """The rows of some clients and their ledger; decides who may spend now."""

    def __init__(self, *, first_id: int = 0, enforce: bool = True) -> None:
        """`first_id`: admission ids start after it; `enforce` False: every request is let
        in and counted (what was admitted while the store was away, written back)."""
        self.enforce = enforce
        self._clients: dict[str, _ClientRow] = {}
        self._usage: dict[tuple[str, str, int], dict[str, Any]] = {}
        self._next_id = first_id
        self._dirty: set[str] = set()  # clients whose row changed since the last snapshot
        self._dirty_usage: set[tuple[str, str, int]] = set()  # ledger rows likewise

    # -- deciding -------------------------------------------------------------------------

    def check(self, client: Client, tokens: int, now: float,
              usd: float = 0.0) -> Refusal | None:
        """Why `client` may not send a request of `tokens` and `usd` (worst cases) now; None
        if it may (always None while not enforcing: decided on a row the store may not
        hold, state/fallback.py)."""
        if not self.enforce:
            return None
        return self._check(self._row(client.name, now), client, tokens, usd)

    @staticmethod
    def _check(row: _ClientRow, client: Client, tokens: int, usd: float) -> Refusal | None:
        win = row.window
        pending = sum(n for n, _ in win.inflight.values()) + tokens
        if client.rpm is not None and sum(win.requests.values()) + 1 > client.rpm:
            return Refusal("rpm", frees(win.requests, 1, client.rpm))
        if client.tpm is not None and sum(win.tokens.values()) + pending > client.tpm:
            return Refusal("tpm", frees(win.tokens, pending, client.tpm))
        if client.daily_tokens is not None and win.day_tokens + pending > client.daily_tokens:
            return Refusal("daily_tokens", (win.day + 1) * DAY_S)
        if client.monthly_usd is not None:
            held = row.month_usd + sum(row.inflight_usd.values())
            if held >= client.monthly_usd or held + max(0.0, usd) > client.monthly_usd:
                return Refusal("monthly_usd", month_start(row.month + 1))
        return None

    def admit(self, client: Client, tokens: int, now: float,
              usd: float = 0.0) -> Admission | Refusal:
        """`check`, and when it passes, count the request now with `tokens` and `usd` in
        flight."""
        row = self._row(client.name, now)
        refusal = self._check(row, client, tokens, usd) if self.enforce else None
        if refusal is not None:
            return refusal
        win = row.window
        self._dirty.add(client.name)
        self._next_id += 1
        _count(win.requests, int(now // 1), 1)
        win.day_requests += 1
        tokens = tokens if tokens > 0 else 0
        win.inflight[self._next_id] = (tokens, now)
        if usd > 0:
            row.inflight_usd[self._next_id] = usd
        return Admission(self._next_id, client.name, tokens, usd if usd > 0 else 0.0)

    # -- recording ------------------------------------------------------------------------

    def settle(self, admission: Admission, spent: Spent, now: float) -> None:
        """The request ended: its true tokens and cost replace the estimate, and its ledger
        row counts it. Idempotent (a second settle of one admission changes nothing)."""
        row = self._row(admission.client, now)
        if row.window.inflight.pop(admission.id, None) is None:
            return
        row.inflight_usd.pop(admission.id, None)
        self._spend(admission.client, row, spent, now)

    def record(self, client: str, spent: Spent, now: float) -> None:
        """A request of a client without limits, counted once at its end (nothing was
        reserved for it: chat/ledger.py writes these behind)."""
        row = self._row(client, now)
        _count(row.window.requests, int(now // 1), 1)
        row.window.day_requests += 1
        self._spend(client, row, spent, now)

    def number_from(self, first_id: int) -> None:
        """Admission ids go on after `first_id` (gates kept live across decisions:
        state/live_clients.py)."""
        self._next_id = max(self._next_id, first_id)

    def _spend(self, client: str, row: _ClientRow, spent: Spent, now: float) -> None:
        win = row.window
        self._dirty.add(client)
        prompt = spent.prompt_tokens if spent.prompt_tokens > 0 else 0
        completion = spent.completion_tokens if spent.completion_tokens > 0 else 0
        usd = spent.cost_usd if spent.cost_usd > 0 else 0.0
        used = prompt + completion
        if used:
            _count(win.tokens, int(now // 1), used)
            win.day_tokens += used
        row.month_usd += usd
        key = (client, spent.route, day_of(now))
        ledger = self._usage.get(key)
        if ledger is None:
            ledger = self._usage[key] = {
                "client": client, "route": spent.route, "day": key[2], "requests": 0,
                "prompt_tokens": 0, "completion_tokens": 0, "cost_usd": 0.0, "errors": 0,
                "cached_tokens": 0, "cache_write_tokens": 0}
        ledger["requests"] += 1
        ledger["prompt_tokens"] += prompt
        if spent.cached_tokens > 0:  # every row held has both cache counts (`restore`)
            ledger["cached_tokens"] += spent.cached_tokens
        if spent.cache_write_tokens > 0:
            ledger["cache_write_tokens"] += spent.cache_write_tokens
        ledger["completion_tokens"] += completion
        ledger["cost_usd"] += usd
        if spent.error:
            ledger["errors"] += 1
        self._dirty_usage.add(key)

    def ledger(self) -> list[dict[str, Any]]:
        """Every ledger row held, as plain data (copies)."""
        return [{**data, "name": f"{client} {route}", "key": day}
                for (client, route, day), data in self._usage.items()]

    # -- rows -----------------------------------------------------------------------------

    def snapshot(self, now: float, *, changed_only: bool = False,
                 shared: bool = True) -> Snapshot:
        """The rows as plain data (`changed_only`: those changed since the last snapshot; the
        work is the changed rows', however many rows are held)."""
        dirty, self._dirty = self._dirty, set()
        dirty_usage, self._dirty_usage = self._dirty_usage, set()
        clients = []
        names = [n for n in dirty if n in self._clients] if changed_only else self._clients
        for name in names:
            row = self._clients[name]
            row.roll(now)
            win = row.window
            clients.append({  # the minute's buckets listed in C (up to 61 each)
                "name": name, "key": 0, "requests": sorted(map(list, win.requests.items())),
                "tokens": sorted(map(list, win.tokens.items())), "day": win.day,
                "day_requests": win.day_requests, "day_tokens": win.day_tokens,
                "inflight": [[i, n, at] for i, (n, at) in win.inflight.items()],
                "inflight_usd": [[i, usd] for i, usd in row.inflight_usd.items()],
                "month": row.month, "month_usd": row.month_usd})
        keys = [k for k in dirty_usage if k in self._usage] if changed_only else self._usage
        usage = [{**self._usage[k], "name": f"{k[0]} {k[1]}", "key": k[2]} for k in keys]
        return {CLIENTS: clients, USAGE: usage}

    def forget(self, name: RowName) -> None:
        """Drop a row held (the store no longer has it: gates kept live across decisions,
        state/sqlite_limits.py)."""
        section, row, key = name
        if section == CLIENTS:
            self._clients.pop(row, None)
            self._dirty.discard(row)
            return
        for held in [k for k in self._usage if k[2] == key and f"{k[0]} {k[1]}" == row]:
            del self._usage[held]  # a client's name may hold a space: matched whole
            self._dirty_usage.discard(held)

    def forget_ledger(self) -> None:
        """Drop every ledger row held (gates kept live: the store keeps them)."""
        self._usage.clear()
        self._dirty_usage.clear()

    def restore(self, data: Snapshot) -> None:
        """Load rows (each replaces what is held of it)."""
        for r in data.get(CLIENTS, []):
            win = Window({int(b): int(n) for b, n in r["requests"]},
                          {int(b): int(n) for b, n in r["tokens"]}, int(r["day"]),
                          int(r["day_requests"]), int(r["day_tokens"]))
            for i, n, at in r.get("inflight", ()):
                win.inflight[int(i)] = (int(n), float(at))
            self._clients[str(r["name"])] = _ClientRow(
                win, int(r["month"]), float(r["month_usd"]),
                {int(i): float(usd) for i, usd in r.get("inflight_usd", ())})
        for r in data.get(USAGE, []):
            self._usage[(str(r["client"]), str(r["route"]), int(r["day"]))] = {
                "client": str(r["client"]), "route": str(r["route"]), "day": int(r["day"]),
                **{k: int(r[k]) for k in ("requests", "prompt_tokens", "completion_tokens",
                                          "errors")},
                # rows written before issue 35 hold no cached counts: 0
                **{k: int(r.get(k, 0)) for k in ("cached_tokens", "cache_write_tokens")},
                "cost_usd": float(r["cost_usd"])}

    def _row(self, client: str, now: float) -> _ClientRow:
        row = self._clients.get(client)
        if row is None:
            row = self._clients[client] = _ClientRow()
        row.roll(now)
        return row


def _count(buckets: dict[int, int], second: int, n: int) -> None:
    """Add `n` to a window's bucket; the buckets stay in time order (Window.roll drops the
    oldest first), also when a request's end is recorded after a later one began."""
    if second in buckets or not buckets or second > next(reversed(buckets)):
        buckets[second] = buckets.get(second, 0) + n
        return
    buckets[second] = n
    ordered = sorted(buckets.items())
    buckets.clear()
    buckets.update(ordered)


def rows_of_request(client: str, route: str | None, now: float) -> list[RowName]:
    """The rows a decision on `client`'s request reads: its limits row, and at settlement
    the ledger row of `route` today."""
    rows = [client_row(client)]
    if route is not None:
        rows.append(usage_row(client, route, day_of(now)))
    return rows


GROUPS = ("client", "route", "day")
COUNTS = ("requests", "prompt_tokens", "completion_tokens", "cost_usd", "errors",
          "cached_tokens", "cache_write_tokens")


def usage_report(rows: list[dict[str, Any]], group_by: tuple[str, ...], *,
                 client: str | None = None, since: float = 0.0) -> list[dict[str, Any]]:
    """Ledger rows summed by `group_by` (of GROUPS), of one `client` or all, from the UTC day
    of `since` on; sorted by the group's values. A `day` is shown as its UTC day number."""
    first_day = day_of(since)
    out: dict[tuple[Any, ...], dict[str, Any]] = {}
    for r in rows:
        if (client is not None and r["client"] != client) or int(r["day"]) < first_day:
            continue
        key = tuple(r[g] for g in group_by)
        total = out.setdefault(key, {**dict(zip(group_by, key, strict=True)),
                                     "requests": 0, "prompt_tokens": 0,
                                     "completion_tokens": 0, "cost_usd": 0.0, "errors": 0,
                                     "cached_tokens": 0, "cache_write_tokens": 0})
        for name in COUNTS:
            total[name] += r.get(name, 0)  # a row from before issue 35: no cached counts
    return [out[k] for k in sorted(out)]
