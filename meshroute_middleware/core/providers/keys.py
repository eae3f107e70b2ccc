"""Per-key gates of provider routes: cooldowns, rpm/rpd/tpm/tpd windows, monthly budgets.

Windows (documented contract; counted in core/providers/windows.py, cooldowns in cooldowns.py):
- rpm and tpm are SLIDING 60-second windows kept in 1-second buckets: an event leaves the
  window up to one second late, never early (so a key is never sent more than its limit, and
  the state stays ≤ 61 buckets whatever the rate). A request counts at the moment it is sent
  (`reserve`); its tokens count when they are known (`settle`, from the upstream's `usage`),
  and until then the reserved estimate counts against tpm/tpd as "in flight".
- rpd and tpd are FIXED windows: counters of the current UTC day, reset at 00:00 UTC.
- The monthly budget (`monthly_tokens` of a model) is a fixed window per key and model, the
  current UTC calendar month.
Rate windows belong to a provider key (`fastco#2`): `rpm = 60` is per key across the provider's
models. Cooldowns, the 429 ladder and budgets belong to a route key (`fastco/big-model#2`).
Keys are named by their 1-based position in the provider's `keys` list, never by their value.

A key the provider refuses (401: the key itself is revoked or wrong, for every model; 403: it
may not use that model) leaves rotation (`revoke`) until an operator clears it
(`POST /v1/cooldowns/clear`) or the gateway restarts; it never comes back by itself and is not
persisted (a restart is how a replaced key value arrives, at the same position).

Shared gates (docs/providers.md, "Several workers, several trackers"): the same state as
plain rows (`snapshot(shared=True)`, which also holds revocations, round-robin positions and
reservations in flight), so an adapter can load the rows one decision reads into a fresh
`KeyGates`, decide here, and write back the rows it changed in one atomic step. `share` > 1
admits only that fraction of every limit (a tracker's part while the shared store is away).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .config import Provider, ProviderModel
from .cooldowns import (
    COOLDOWN_LADDER_S,
    LADDER_RESET_S,
    RETRY_AFTER_MAX_S,
    KeyRoute,
    cool_down,
    parse_retry_after,
)
from .peers import Peers, PeerState, Usage
from .windows import DAY_S, INFLIGHT_TTL_S, MINUTE_S, Window, frees, month_start

__all__ = ["COOLDOWN_LADDER_S", "DAY_S", "INFLIGHT_TTL_S", "LADDER_RESET_S", "MINUTE_S",
           "REASONS", "RETRY_AFTER_MAX_S", "REVOKING_STATUSES", "SHARED_SECTIONS", "KeyGates",
           "Refusal", "Reservation", "RowName", "Snapshot", "key_route", "parse_retry_after",
           "route_name", "rows_of_route", "split_key_route"]

Snapshot = dict[str, list[dict[str, Any]]]  # section -> rows of plain data (the state store's)
RowName = tuple[str, str, int]  # (section, provider or route name, 1-based key; 0 for a cursor)
SHARED_SECTIONS = ("windows", "keys", "revoked", "cursor")  # what shared gates keep in a store
REASONS = ("cooldown", "rpm", "rpd", "tpm", "tpd", "budget", "revoked")
REVOKING_STATUSES = (401, 403)  # a provider refusing the key, not the request


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a key cannot take a request now, and when that ends (None: not known)."""

    reason: str
    until: float | None = None


@dataclass(frozen=True, slots=True)
class Reservation:
    """A request sent on a key: its estimate counts against tpm/tpd until settled."""

    id: int
    provider: str
    route: str
    key: int
    tokens: int


def route_name(provider: str, model_id: str) -> str:
    return f"{provider}/{model_id}"


def key_route(route: str, key: int) -> str:
    """The display name of one key on one route: `fastco/big-model#2`."""
    return f"{route}#{key}"


def split_key_route(route: str | None) -> tuple[str | None, int | None]:
    """`fastco/big-model#2` → (`fastco/big-model`, 2); anything else → (route, None)."""
    if route is None:
        return None, None
    head, sep, tail = route.rpartition("#")
    if sep and tail.isdigit():
        return head, int(tail)
    return route, None


class KeyGates:
    """Every key's limits and cooldowns; decides which key of a route takes the next request."""

    mode = "local"  # where the state lives (`GET /v1/routing/chain` says it per key)

    def __init__(self, *, first_id: int = 0, share: int = 1) -> None:
        """`first_id`: reservation ids start after it (unique across the processes that share
        a store); `share`: every limit is divided by it (at least 1 left)."""
        self._windows: dict[tuple[str, int], Window] = {}
        self._routes: dict[tuple[str, int], KeyRoute] = {}
        self._cursor: dict[str, int] = {}
        self._next_id = first_id
        self.share = max(1, share)
        self._dirty: set[RowName] = set()  # (section, name, key) changed rows
        # (provider name for a 401, route name for a 403, key) -> the status that revoked it
        self._revoked: dict[tuple[str, int], int] = {}
        self._revoked_at: dict[tuple[str, int], float] = {}  # when (for peers' clears)
        # (route or "*", key or 0) -> when a clear lifted what was set before it
        self._cleared_at: dict[tuple[str, int], float] = {}
        self.peers: Peers | None = None  # trackers gossiping their keys (core/providers/peers)

    # -- deciding -------------------------------------------------------------------------

    def check(self, provider: Provider, model: ProviderModel, key: int, tokens: int,
              now: float) -> Refusal | None:
        """Why `key` (1-based) cannot send `tokens` (estimate) to `model` now; None if it can."""
        if ((self._revoked or self.peers is not None)
                and self.revoked(provider.name, model.id, key) is not None):
            return Refusal("revoked")
        route = self._route(provider.name, model.id, key, now)
        if route.cooldown_until > now and not (
                self.peers is not None and route.last_429_at < self._cleared(
                    route_name(provider.name, model.id), key)):
            return Refusal("cooldown", route.cooldown_until)
        if self.peers is not None:
            refusal = self._peer_refusal(provider.name, model.id, key, now)
            if refusal is not None:
                return refusal
        win, lim = self._window(provider.name, key, now), provider.limits
        rpd, tpd, rpm, tpm, budget = (self._part(x) for x in (
            lim.rpd, lim.tpd, lim.rpm, lim.tpm, model.monthly_tokens))
        midnight = (win.day + 1) * DAY_S
        pending = sum(n for n, _ in win.inflight.values()) + tokens
        peer = Usage() if self.peers is None else self.peers.usage(provider.name, key, now)
        if rpd is not None and win.day_requests + peer.day_requests >= rpd:
            return Refusal("rpd", midnight)
        if tpd is not None and win.day_tokens + peer.day_tokens + pending > tpd:
            return Refusal("tpd", midnight if pending <= tpd else None)
        if rpm is not None and sum(win.requests.values()) + peer.minute_requests + 1 > rpm:
            return Refusal("rpm", frees(win.requests, 1 + peer.minute_requests, rpm)
                           or (now + MINUTE_S if peer.minute_requests else None))
        if tpm is not None and sum(win.tokens.values()) + peer.minute_tokens + pending > tpm:
            return Refusal("tpm", frees(win.tokens, pending + peer.minute_tokens, tpm)
                           or (now + MINUTE_S if peer.minute_tokens else None))
        if budget is not None and route.month_tokens + tokens > budget:
            return Refusal("budget", month_start(route.month + 1))
        return None

    def pick(self, provider: Provider, model: ProviderModel, tokens: int, now: float,
             prefer: tuple[int, ...] = ()) -> tuple[int | None, list[tuple[int, Refusal]]]:
        """Round-robin: the next key (1-based) that passes every gate, and who was refused why.

        `tokens` is the caller's estimate of the request's total (prompt + completion) tokens.
        `prefer`: the keys to try, in this order, instead (a conversation's: affinity.py);
        the round-robin position is left where it is.
        """
        n = len(provider.keys)
        name = route_name(provider.name, model.id)
        start = self._cursor.get(name, 0) % n
        refused: list[tuple[int, Refusal]] = []
        for key in prefer or [(start + step) % n + 1 for step in range(n)]:
            refusal = self.check(provider, model, key, tokens, now)
            if refusal is None:
                if not prefer:
                    self._cursor[name] = key % n
                    self._dirty.add(("cursor", name, 0))
                return key, refused
            refused.append((key, refusal))
        return None, refused

    def take(self, provider: Provider, model: ProviderModel, tokens: int, now: float,
             prefer: tuple[int, ...] = ()) -> tuple[Reservation | None, list[tuple[int, Refusal]]]:
        """`pick` and `reserve` in one step: the reservation made, and who was refused why."""
        key, refused = self.pick(provider, model, tokens, now, prefer)
        if key is None:
            return None, refused
        return self.reserve(provider, model, key, tokens, now), refused

    # -- recording ------------------------------------------------------------------------

    def reserve(self, provider: Provider, model: ProviderModel, key: int, tokens: int,
                now: float) -> Reservation:
        """Count a request sent on `key` now; its `tokens` estimate is in flight until settled."""
        win = self._window(provider.name, key, now)
        self._dirty.add(("windows", provider.name, key))
        self._next_id += 1
        second = int(now // 1)
        win.requests[second] = win.requests.get(second, 0) + 1
        win.day_requests += 1
        win.inflight[self._next_id] = (max(0, tokens), now)
        return Reservation(self._next_id, provider.name, route_name(provider.name, model.id),
                           key, max(0, tokens))

    def settle(self, reservation: Reservation, used_tokens: int | None, now: float) -> None:
        """Replace the estimate by the `usage` total (None: keep the estimate). Idempotent."""
        win = self._window(reservation.provider, reservation.key, now)
        if win.inflight.pop(reservation.id, None) is None:
            return
        self._dirty.add(("windows", reservation.provider, reservation.key))
        used = reservation.tokens if used_tokens is None else max(0, used_tokens)
        if used:
            second = int(now // 1)
            win.tokens[second] = win.tokens.get(second, 0) + used
            win.day_tokens += used
            self._dirty.add(("windows", reservation.provider, reservation.key))
            self._dirty.add(("keys", reservation.route, reservation.key))
            self._route(reservation.provider, reservation.route.partition("/")[2],
                        reservation.key, now).month_tokens += used

    def rate_limited(self, route: str, key: int, retry_after_s: float | None,
                     now: float) -> float:
        """A 429 on `route` key `key`: cool it down (Retry-After, else the ladder); the end."""
        self._dirty.add(("keys", route, key))
        return cool_down(self._routes.setdefault((route, key), KeyRoute()), retry_after_s,
                         now)

    def revoke(self, provider: str, model_id: str, key: int, status: int,
               now: float = 0.0) -> None:
        """The provider answered 401 (the key, every model) or 403 (the key on this model):
        take it out of rotation until cleared."""
        if status not in REVOKING_STATUSES:
            raise ValueError(f"status {status} does not revoke a key")
        name = provider if status == 401 else route_name(provider, model_id)
        self._revoked[(name, key)] = status
        self._revoked_at[(name, key)] = now
        self._dirty.add(("revoked", name, key))

    def revoked(self, provider: str, model_id: str, key: int) -> int | None:
        """The status that took `key` out of rotation for `model_id`, or None."""
        route = route_name(provider, model_id)
        for held in ((provider, key), (route, key)):
            status = self._revoked.get(held)
            if status is not None and not (self.peers is not None and self._revoked_at.get(
                    held, 0.0) < self._cleared(route, key)):
                return status
        if self.peers is not None:
            for (name, pos), (peer_status, at) in self._peer_revoked().items():
                if pos == key and name in (provider, route) and at >= self._cleared(route, key):
                    return peer_status
        return None

    def succeeded(self, route: str, key: int) -> None:
        """A success ends the 429 ladder of that key on that route."""
        state = self._routes.get((route, key))
        if state is not None and state.strikes:
            state.strikes = 0
            self._dirty.add(("keys", route, key))

    def clear(self, route: str | None = None, key: int | None = None,
              now: float | None = None) -> int:
        """Lift cooldowns and revocations (of one route, one route key, or all) and restart
        the ladders. A route's revocations include its provider's (a 401 revokes the key of
        every model).

        Returns how many keys were cooling down (or had been: a lapsed cooldown counts too)
        or revoked.
        """
        provider = None if route is None else route.partition("/")[0]
        if now is not None:  # what peers set before now is lifted too (their gossip)
            self._cleared_at[(route or "*", key or 0)] = now
        cleared = 0
        for name, pos in list(self._revoked):
            if (route is None or name in (route, provider)) and (key is None or pos == key):
                del self._revoked[(name, pos)]
                self._revoked_at.pop((name, pos), None)
                self._dirty.add(("revoked", name, pos))
                cleared += 1
        for (name, pos), state in self._routes.items():
            if (route is None or name == route) and (key is None or pos == key):
                cleared += state.cooldown_until > 0
                if state.cooldown_until or state.strikes:
                    self._dirty.add(("keys", name, pos))
                state.cooldown_until, state.strikes = 0.0, 0
        return cleared

    # -- display --------------------------------------------------------------------------

    def month_tokens(self, route: str, key: int, now: float) -> int:
        state = self._routes.get((route, key))
        if state is None:
            return 0
        state.roll(now)
        return state.month_tokens

    def key_states(self, provider: Provider, model: ProviderModel,
                   now: float) -> list[dict[str, Any]]:
        """The chain endpoint's `keys` list: ready, cooldown, limited or revoked (reason: the
        status that revoked it, `http_401` or `http_403`), with until and reason."""
        out: list[dict[str, Any]] = []
        for key in range(1, len(provider.keys) + 1):
            refusal = self.check(provider, model, key, 0, now)
            reason = None if refusal is None else refusal.reason
            state = "ready" if refusal is None else (
                refusal.reason if refusal.reason in ("cooldown", "revoked") else "limited")
            if refusal is not None and refusal.reason == "revoked":
                reason = f"http_{self.revoked(provider.name, model.id, key)}"
            out.append({"key": key, "state": state,
                        "until": None if refusal is None else refusal.until,
                        "reason": reason, "limits": self.mode})
        return out

    # -- persistence ----------------------------------------------------------------------

    def snapshot(self, now: float, *, changed_only: bool = False,
                 shared: bool = False) -> Snapshot:
        """Plain data for the state store: rows named by provider/route and key position.

        `changed_only`: just the rows changed since the previous snapshot (write-through);
        `shared`: also revocations (`status` 0: cleared), round-robin positions and
        reservations in flight, which a state file of one process does not keep.
        """
        dirty, self._dirty = self._dirty, set()
        windows = []
        for (name, key), win in self._windows.items():
            if changed_only and ("windows", name, key) not in dirty:
                continue
            win.roll(now)
            row = {"name": name, "key": key,
                   "requests": sorted([b, n] for b, n in win.requests.items()),
                   "tokens": sorted([b, n] for b, n in win.tokens.items()),
                   "day": win.day,
                   "day_requests": win.day_requests, "day_tokens": win.day_tokens}
            if shared:
                row["inflight"] = [[i, n, at] for i, (n, at) in win.inflight.items()]
            windows.append(row)
        routes = [{"name": name, "key": key, "cooldown_until": s.cooldown_until,
                   "strikes": s.strikes, "last_429_at": s.last_429_at, "month": s.month,
                   "month_tokens": s.month_tokens} for (name, key), s in self._routes.items()
                  if not changed_only or ("keys", name, key) in dirty]
        if not shared:
            return {"windows": windows, "keys": routes}
        revoked = [{"name": name, "key": key, "status": self._revoked.get((name, key), 0)}
                   for section, name, key in dirty if section == "revoked"]
        if not changed_only:
            revoked = [{"name": name, "key": key, "status": status}
                       for (name, key), status in self._revoked.items()]
        cursor = [{"name": name, "key": 0, "next": pos} for name, pos in self._cursor.items()
                  if not changed_only or ("cursor", name, 0) in dirty]
        return {"windows": windows, "keys": routes, "revoked": revoked, "cursor": cursor}

    def restore(self, data: Snapshot) -> None:
        """Load a snapshot (tokens in flight at the time are not in it: they were never used).

        Rows of a shared snapshot replace what is held of them: a revocation row of status 0
        lifts one, a window's `inflight` (when present) replaces its reservations."""
        for row in data.get("windows", []):
            win = self._windows[(str(row["name"]), int(row["key"]))] = Window(
                {int(b): int(n) for b, n in row["requests"]},
                {int(b): int(n) for b, n in row["tokens"]}, int(row["day"]),
                int(row["day_requests"]), int(row["day_tokens"]))
            for i, n, at in row.get("inflight", ()):
                win.inflight[int(i)] = (int(n), float(at))
        for row in data.get("keys", []):
            self._routes[(str(row["name"]), int(row["key"]))] = KeyRoute(
                float(row["cooldown_until"]), int(row["strikes"]), float(row["last_429_at"]),
                int(row["month"]), int(row["month_tokens"]))
        for row in data.get("revoked", []):
            name, status = (str(row["name"]), int(row["key"])), int(row["status"])
            if status in REVOKING_STATUSES:
                self._revoked[name] = status
            else:
                self._revoked.pop(name, None)
        for row in data.get("cursor", []):
            self._cursor[str(row["name"])] = int(row["next"])

    # -- gossip (no shared store: core/providers/peers.py) ---------------------------------

    def report(self, now: float) -> PeerState:
        """This tracker's cooldowns, revocations, clears and usage, for its peers."""
        cooldowns = {name: (s.cooldown_until, s.last_429_at)
                     for name, s in self._routes.items() if s.cooldown_until > now}
        revoked = {name: (status, self._revoked_at.get(name, 0.0))
                   for name, status in self._revoked.items()}
        usage = {}
        for name, win in self._windows.items():
            win.roll(now)
            usage[name] = Usage(sum(win.requests.values()), sum(win.tokens.values()) + sum(
                n for n, _ in win.inflight.values()), win.day, win.day_requests, win.day_tokens)
        return PeerState(now, {}, cooldowns, revoked, dict(self._cleared_at), usage)

    def _cleared(self, route: str, key: int) -> float:
        """When the latest clear that covers (route, key) happened, here or at a peer."""
        clears = [self._cleared_at]
        if self.peers is not None:
            clears.append(self.peers.clears())
        return max((c.get(name, -1.0) for c in clears
                    for name in ((route, key), (route, 0), ("*", 0))), default=-1.0)

    def _peer_revoked(self) -> dict[tuple[str, int], tuple[int, float]]:
        out: dict[tuple[str, int], tuple[int, float]] = {}
        for state in (self.peers.states.values() if self.peers is not None else ()):
            out.update(state.revoked)
        return out

    def _peer_refusal(self, provider: str, model_id: str, key: int,
                      now: float) -> Refusal | None:
        """A peer's cooldown of this key not lifted by a newer clear."""
        route = route_name(provider, model_id)
        assert self.peers is not None
        held = self.peers.cooldowns().get((route, key))
        if held is not None and held[0] > now and held[1] >= self._cleared(route, key):
            return Refusal("cooldown", held[0])
        return None

    # -- internals ------------------------------------------------------------------------

    def _part(self, limit: int | None) -> int | None:
        """This gate's part of a limit: all of it, or 1/share of it (at least 1)."""
        return limit if limit is None or self.share == 1 else max(1, limit // self.share)

    def _window(self, provider: str, key: int, now: float) -> Window:
        win = self._windows.setdefault((provider, key), Window())
        win.roll(now)
        return win

    def _route(self, provider: str, model_id: str, key: int, now: float) -> KeyRoute:
        state = self._routes.setdefault((route_name(provider, model_id), key), KeyRoute())
        state.roll(now)
        return state


def rows_of_route(provider: Provider, model: ProviderModel) -> list[RowName]:
    """Every row a decision on a route reads: its provider's windows and 401 revocations, the
    route's keys, 403 revocations and round-robin position."""
    route = route_name(provider.name, model.id)
    keys = range(1, len(provider.keys) + 1)
    return [*(("windows", provider.name, k) for k in keys), *(("keys", route, k) for k in keys),
            *(("revoked", provider.name, k) for k in keys),
            *(("revoked", route, k) for k in keys), ("cursor", route, 0)]
