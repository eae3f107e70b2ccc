"""`--limits-store redis://host:port/db`: the shared gates' rows in Redis (≥ 6, or Valkey), for
trackers on several hosts.

Each row is one string key, `meshroute:limits:<section>:<provider or route>:<key position>`
(never a key's value), holding the row's JSON. A decision reads its rows with one MGET (atomic),
runs in the core (`KeyGates`), and writes the rows it changed with one Lua script that first
checks every row it read is still as read (compare-and-set over the rows of the decision); a
decision that lost a race runs again on the new rows. Rows expire when nothing in them matters
any more (a window after its UTC day, a cooldown row after its cooldown, ladder and month,
a cleared revocation at once), so an idle store empties itself. Trackers say every
HEARTBEAT_S that they use the store (a sorted set scored by time): the fallback's share.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import redis.asyncio as aredis
import redis.exceptions
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from meshroute_middleware.core.providers.keys import (
    DAY_S,
    INFLIGHT_TTL_S,
    LADDER_RESET_S,
    MINUTE_S,
    KeyGates,
    RowName,
)
from meshroute_middleware.state.limits import (
    TRACKERS_WINDOW_S,
    G,
    LimitsStoreDown,
    LimitsStoreError,
    Outcome,
    decide,
    decode,
    encode,
    key_gates,
    rows_by_section,
)

T = TypeVar("T")
PREFIX = "meshroute:limits:"
TIMEOUT_S = 0.25  # a store slower than this on loopback or a LAN is as good as gone
MAX_RACES = 64  # a decision that keeps losing compare-and-set this often: the store fails
KEEP_CURSOR_S = DAY_S

# KEYS: the rows read. ARGV: n, then n values as read ('' for none), then triples (index of
# the key, new value, time to live in ms; 0: none). All or nothing; 0 when a row moved.
_CAS = """
local n = tonumber(ARGV[1])
for i = 1, n do
  if (redis.call('GET', KEYS[i]) or '') ~= ARGV[i + 1] then return 0 end
end
local j = n + 2
while j <= #ARGV do
  local key, ttl = KEYS[tonumber(ARGV[j])], tonumber(ARGV[j + 2])
  if ttl > 0 then redis.call('SET', key, ARGV[j + 1], 'PX', ttl)
  else redis.call('SET', key, ARGV[j + 1]) end
  j = j + 3
end
return 1
"""


def redis_key(row: RowName) -> str:
    section, name, key = row
    return f"{PREFIX}{section}:{name}:{key}"


def expiry_s(section: str, row: dict[str, Any], now: float) -> float | None:
    """Seconds a row must live (None: until changed): past it, nothing in it counts."""
    if section == "windows":
        ends = [(int(row["day"]) + 1) * DAY_S, now + MINUTE_S + 1]
        ends += [float(at) + INFLIGHT_TTL_S for _, _, at in row.get("inflight", ())]
        return max(ends) - now
    if section == "keys":
        return max(_month_end(int(row["month"]), now), float(row["cooldown_until"]),
                   float(row["last_429_at"]) + LADDER_RESET_S, now + 1) - now
    if section == "clients":  # a client's windows: its month's spend, its day, its minute
        ends = [_month_end(int(row["month"]), now), (int(row["day"]) + 1) * DAY_S,
                now + MINUTE_S + 1]
        ends += [float(at) + INFLIGHT_TTL_S for _, _, at in row.get("inflight", ())]
        return max(ends) - now
    if section == "usage":  # the ledger is kept (a few rows per client, route and day)
        return None
    if section == "revoked":
        return None if int(row["status"]) else 1.0
    return KEEP_CURSOR_S


def _month_end(month: int, now: float) -> float:
    """When the UTC month `month` (year * 12 + month - 1) ends; `now` for none."""
    if month < 0:
        return now
    return datetime(month // 12 + (month % 12 == 11), (month + 1) % 12 + 1, 1,
                    tzinfo=UTC).timestamp()


class RedisLimits:
    """Shared gates' rows in one Redis database (asyncio client)."""

    mode = "redis"
    blocking = False

    def __init__(self, url: str, timeout_s: float = TIMEOUT_S) -> None:
        self.url = url
        # one immediate retry on a broken connection: after a restart of the server every
        # pooled connection is stale, and a new one answers (a timeout is not retried)
        self.client: aredis.Redis = aredis.Redis.from_url(
            url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
            retry=Retry(NoBackoff(), 1), retry_on_error=[redis.exceptions.ConnectionError])
        self._cas = self.client.register_script(_CAS)

    @staticmethod
    def check(url: str, timeout_s: float = 2.0) -> None:
        """At start: the store answers (LimitsStoreError, one line, if not)."""
        try:
            client = redis.Redis.from_url(url, socket_timeout=timeout_s,
                                          socket_connect_timeout=timeout_s)
        except ValueError as exc:
            raise LimitsStoreError(f"--limits-store {url}: {exc}") from exc
        try:
            client.ping()
        except redis.exceptions.RedisError as exc:
            raise LimitsStoreError(f"--limits-store {url} does not answer: {exc}") from exc
        finally:
            client.close()

    def transact_now(self, rows: Sequence[RowName], op: Callable[[KeyGates], T], now: float,
                     first_id: int) -> Outcome[T]:
        raise LimitsStoreDown("the redis store is only used from the event loop")

    async def transact(self, rows: Sequence[RowName], op: Callable[[KeyGates], T],
                       now: float, first_id: int) -> Outcome[T]:
        return await self.transact_with(rows, key_gates, op, now, first_id)

    async def scan(self, section: str) -> list[dict[str, Any]]:
        """Every row of `section`: SCAN its keys, then MGET them (rows may move between)."""
        prefix = f"{PREFIX}{section}:"
        try:
            keys = [k async for k in self.client.scan_iter(match=prefix + "*", count=500)]
            values = await self.client.mget(keys) if keys else []
        except (redis.exceptions.RedisError, OSError) as exc:
            raise LimitsStoreDown(f"redis {self._where()}: {exc}") from exc
        out = []
        for key, value in zip(keys, values, strict=True):
            if value is None:
                continue
            name, _, pos = (key.decode() if isinstance(key, bytes) else key)[
                len(prefix):].rpartition(":")
            out.append(decode((section, name, int(pos)), value))
        return out

    async def transact_with(self, rows: Sequence[RowName], make: Callable[[int], G],
                            op: Callable[[G], T], now: float, first_id: int) -> Outcome[T]:
        names = list(rows)
        keys = [redis_key(r) for r in names]
        index = {r: i for i, r in enumerate(names)}
        try:
            for _ in range(MAX_RACES):
                values = await self.client.mget(keys)
                loaded = rows_by_section({
                    r: decode(r, v) for r, v in zip(names, values, strict=True) if v})
                result, changed, after = decide(loaded, op, now, first_id, make)
                writes: list[Any] = []
                for section, items in changed.items():
                    for row in items:
                        ttl = expiry_s(section, row, now)
                        writes += [index[(section, str(row["name"]), int(row["key"]))] + 1,
                                   encode(row), 0 if ttl is None else max(1, math.ceil(
                                       ttl * 1000))]
                if not writes:  # nothing changed: the MGET was one consistent read
                    return Outcome(result, after)
                read = [(v.decode() if isinstance(v, bytes) else v) or "" for v in values]
                if await self._cas(keys=keys, args=[len(keys), *read, *writes]):
                    return Outcome(result, after)
        except (redis.exceptions.RedisError, OSError) as exc:
            raise LimitsStoreDown(f"redis {self._where()}: {exc}") from exc
        raise LimitsStoreDown(f"redis {self._where()}: {MAX_RACES} races lost in a row")

    async def heartbeat(self, tracker: str, now: float) -> int:
        key = PREFIX + "trackers"
        try:
            async with self.client.pipeline(transaction=True) as pipe:
                pipe.zadd(key, {tracker: now})
                pipe.zremrangebyscore(key, "-inf", now - TRACKERS_WINDOW_S)
                pipe.zcard(key)
                pipe.expire(key, int(TRACKERS_WINDOW_S * 2))
                *_, count, _ = await pipe.execute()
        except (redis.exceptions.RedisError, OSError) as exc:
            raise LimitsStoreDown(f"redis {self._where()}: {exc}") from exc
        return int(count)

    async def close(self) -> None:
        await self.client.aclose()

    def _where(self) -> str:
        kw = self.client.connection_pool.connection_kwargs
        return f"{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}"
