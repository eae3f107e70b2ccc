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

The usage ledger is indexed per client: a sorted set `meshroute:ledger:<client>` of its rows'
keys scored by UTC day, written by the same script, so that a client's `GET /v1/usage` reads
its own rows only; ledger rows expire `retention_days` after their day (the index is pruned
as it is written).

A busy store is not a store that is down: connections come from a blocking pool (a request
waits up to POOL_WAIT_S for one), decisions on the same rows in one process take turns (so
they do not race each other's compare-and-set), a lost race is run again, and an answer may
take up to ANSWER_TIMEOUT_S; one decision takes DECISION_DEADLINE_S at most, all included.
Only a refused or broken connection, or a wait past those bounds, is an outage
(docs/providers.md, "Several workers, several trackers").
"""

from __future__ import annotations

import asyncio
import math
import random
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, TypeVar

import orjson
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
    RETENTION_DAYS,
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
LEDGER = "meshroute:ledger:"  # + client: the sorted set of its ledger rows' keys, by day
LEDGER_CLIENTS = "meshroute:ledger-clients"  # the clients that have an index
LEDGER_INDEXED = "meshroute:ledger-indexed"  # set once rows of older versions are indexed
CONNECT_TIMEOUT_S = 0.25  # a store that takes longer to accept a connection is not there
ANSWER_TIMEOUT_S = 2.0  # a slow answer is waited for this long before the store counts as gone
POOL_SIZE = 64  # connections per process; more requests wait for one (POOL_WAIT_S)
POOL_WAIT_S = 5.0  # the longest a decision waits for a free connection
DECISION_DEADLINE_S = 5.0  # the longest one decision waits, its turn and the pool included
MAX_RACES = 64  # compare-and-set races lost in a row (other processes) before giving up
RACE_BACKOFF_S = 0.002  # up to this (random) between two tries of a decision that lost
MGET_CHUNK = 2000  # ledger keys read per MGET
KEEP_CURSOR_S = DAY_S

# KEYS: the n rows read, then the ledger indexes written, then LEDGER_CLIENTS. ARGV: n, the n
# values as read ('' for none), w, w triples (index of the key, new value, time to live in ms;
# 0: none), then a sextuple per ledger row written (index of its ledger index key, its day,
# index of its key, the first day kept, the index's time to live in ms, the client). All or
# nothing; 0 when a row moved.
_CAS = """
local n = tonumber(ARGV[1])
for i = 1, n do
  if (redis.call('GET', KEYS[i]) or '') ~= ARGV[i + 1] then return 0 end
end
local w = tonumber(ARGV[n + 2])
local j = n + 3
for _ = 1, w do
  local key, ttl = KEYS[tonumber(ARGV[j])], tonumber(ARGV[j + 2])
  if ttl > 0 then redis.call('SET', key, ARGV[j + 1], 'PX', ttl)
  else redis.call('SET', key, ARGV[j + 1]) end
  j = j + 3
end
while j <= #ARGV do
  local index, ttl = KEYS[tonumber(ARGV[j])], tonumber(ARGV[j + 4])
  redis.call('ZADD', index, tonumber(ARGV[j + 1]), KEYS[tonumber(ARGV[j + 2])])
  redis.call('ZREMRANGEBYSCORE', index, '-inf', '(' .. ARGV[j + 3])
  redis.call('PEXPIRE', index, ttl)
  redis.call('SADD', KEYS[#KEYS], ARGV[j + 5])
  redis.call('PEXPIRE', KEYS[#KEYS], ttl)
  j = j + 6
end
return 1
"""


def redis_key(row: RowName) -> str:
    section, name, key = row
    return f"{PREFIX}{section}:{name}:{key}"


def ledger_index(client: str) -> str:
    return f"{LEDGER}{client}"


def expiry_s(section: str, row: dict[str, Any], now: float,
             retention_days: int = RETENTION_DAYS) -> float | None:
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
    if section == "usage":  # the ledger: kept `retention_days` after its UTC day
        return max(1.0, (int(row["day"]) + 1 + retention_days) * DAY_S - now)
    if section == "revoked":
        return None if int(row["status"]) else 1.0
    return KEEP_CURSOR_S


def _month_end(month: int, now: float) -> float:
    """When the UTC month `month` (year * 12 + month - 1) ends; `now` for none."""
    if month < 0:
        return now
    return datetime(month // 12 + (month % 12 == 11), (month + 1) % 12 + 1, 1,
                    tzinfo=UTC).timestamp()


def _ms(seconds: float | None) -> int:
    return 0 if seconds is None else max(1, math.ceil(seconds * 1000))


def _text(value: bytes | str | None) -> str:
    return (value.decode() if isinstance(value, bytes) else value) or ""


class RedisLimits:
    """Shared gates' rows in one Redis database (asyncio client)."""

    mode = "redis"
    blocking = False

    def __init__(self, url: str, timeout_s: float = ANSWER_TIMEOUT_S, *,
                 retention_days: int = RETENTION_DAYS, pool_size: int = POOL_SIZE,
                 pool_wait_s: float = POOL_WAIT_S,
                 deadline_s: float = DECISION_DEADLINE_S) -> None:
        self.url, self.retention_days = url, retention_days
        # one immediate retry on a broken connection: after a restart of the server every
        # pooled connection is stale, and a new one answers (a timeout is not retried)
        pool = aredis.BlockingConnectionPool.from_url(
            url, max_connections=pool_size, timeout=pool_wait_s, socket_timeout=timeout_s,
            socket_connect_timeout=min(timeout_s, CONNECT_TIMEOUT_S),
            retry=Retry(NoBackoff(), 1), retry_on_error=[redis.exceptions.ConnectionError])
        self.client: aredis.Redis = aredis.Redis(connection_pool=pool)
        self._cas = self.client.register_script(_CAS)
        self._turns: dict[RowName, asyncio.Lock] = {}  # decisions on the same rows queue
        self._indexed = False  # the ledger's rows of older versions are indexed
        self.deadline_s = deadline_s
        self._failed_at = -math.inf  # (loop time) when a decision last failed

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
            values = await self._mget(keys)
        except (redis.exceptions.RedisError, OSError) as exc:
            raise LimitsStoreDown(f"redis {self._where()}: {exc}") from exc
        return [_row_of(section, prefix, k, v) for k, v in zip(keys, values, strict=True)
                if v is not None]

    async def usage(self, client: str | None, first_day: int) -> list[dict[str, Any]]:
        """The ledger rows of `client` (None: every client's) from `first_day` on, through
        the per-client indexes: a client's rows cost in proportion to its own."""
        prefix = f"{PREFIX}usage:"
        try:
            if not self._indexed:
                await self._index_ledger()
            if client is None:
                clients = sorted(_text(c) for c in await self.client.smembers(LEDGER_CLIENTS))
            else:
                clients = [client]
            async with self.client.pipeline(transaction=False) as pipe:
                for name in clients:
                    pipe.zrangebyscore(ledger_index(name), first_day, "+inf")
                keys = [k for found in await pipe.execute() for k in found]
            values = await self._mget(keys)
        except (redis.exceptions.RedisError, OSError) as exc:
            raise LimitsStoreDown(f"redis {self._where()}: {exc}") from exc
        return [_row_of("usage", prefix, k, v) for k, v in zip(keys, values, strict=True)
                if v is not None]

    async def transact_with(self, rows: Sequence[RowName], make: Callable[[int], G],
                            op: Callable[[G], T], now: float, first_id: int) -> Outcome[T]:
        """Decide on `rows` and write what changed, compare-and-set; decisions of this
        process on the same rows take turns, a race lost to another process runs again; it all
        takes at most `deadline_s`, and decisions waiting their turn when one fails fail at
        once (LimitsStoreDown: the caller decides locally)."""
        loop = asyncio.get_running_loop()
        asked_at = loop.time()
        try:
            async with asyncio.timeout(self.deadline_s):
                if not rows:
                    return await self._decide(rows, make, op, now, first_id)
                # one lock per first row (a client's, a route's first key): as many as the
                # config has
                async with self._turns.setdefault(rows[0], asyncio.Lock()):
                    if self._failed_at > asked_at:  # failed while this one waited its turn
                        raise LimitsStoreDown(f"redis {self._where()}: failed meanwhile")
                    return await self._decide(rows, make, op, now, first_id)
        except TimeoutError as exc:
            self._failed_at = loop.time()
            raise LimitsStoreDown(f"redis {self._where()}: no decision within "
                                  f"{self.deadline_s:g} s") from exc

    async def _decide(self, rows: Sequence[RowName], make: Callable[[int], G],
                      op: Callable[[G], T], now: float, first_id: int) -> Outcome[T]:
        names = list(rows)
        keys = [redis_key(r) for r in names]
        try:
            for race in range(MAX_RACES):
                if race:
                    await asyncio.sleep(random.uniform(0, RACE_BACKOFF_S))
                values = await self.client.mget(keys)
                loaded = rows_by_section({
                    r: decode(r, v) for r, v in zip(names, values, strict=True) if v})
                result, changed, after = decide(loaded, op, now, first_id, make)
                if not any(changed.values()):  # nothing changed: the MGET was one read
                    return Outcome(result, after)
                args = self._writes(names, keys, changed, now)
                read = [_text(v) for v in values]
                if await self._cas(keys=args[0], args=[len(keys), *read, *args[1]]):
                    return Outcome(result, after)
        except (redis.exceptions.RedisError, OSError) as exc:
            self._failed_at = asyncio.get_running_loop().time()
            raise LimitsStoreDown(f"redis {self._where()}: {exc}") from exc
        raise LimitsStoreDown(f"redis {self._where()}: {MAX_RACES} races lost in a row")

    def _writes(self, names: list[RowName], keys: list[str],
                changed: dict[str, list[dict[str, Any]]], now: float,
                ) -> tuple[list[str], list[Any]]:
        """The script's KEYS and the ARGV after the values read: rows, then ledger indexes."""
        index = {r: i for i, r in enumerate(names)}
        all_keys, writes, ledger = list(keys), [], []
        first_kept = int(now // DAY_S) - self.retention_days
        for section, items in changed.items():
            for row in items:
                at = index[(section, str(row["name"]), int(row["key"]))] + 1
                ttl = expiry_s(section, row, now, self.retention_days)
                writes += [at, encode(row), _ms(ttl)]
                if section == "usage":
                    all_keys.append(ledger_index(str(row["client"])))
                    ledger += [len(all_keys), int(row["key"]), at, first_kept,
                               _ms(ttl), str(row["client"])]
        all_keys.append(LEDGER_CLIENTS)
        return all_keys, [len(writes) // 3, *writes, *ledger]

    async def _index_ledger(self) -> None:
        """Once per database: index (and give an expiry to) ledger rows written before the
        ledger had an index (they have no expiry), so that they are read and expire like
        the others."""
        if await self.client.exists(LEDGER_INDEXED):
            self._indexed = True
            return
        now = time.time()
        keys = [k async for k in self.client.scan_iter(match=f"{PREFIX}usage:*", count=1000)]
        for start in range(0, len(keys), MGET_CHUNK):
            chunk = keys[start:start + MGET_CHUNK]
            async with self.client.pipeline(transaction=False) as pipe:
                for key in chunk:
                    pipe.pttl(key)
                ttls = await pipe.execute()
            async with self.client.pipeline(transaction=False) as pipe:
                for key, value, ttl in zip(chunk, await self.client.mget(chunk), ttls,
                                           strict=True):
                    if value is None or ttl != -1:  # gone, or written with its index
                        continue
                    row = _row_of("usage", f"{PREFIX}usage:", key, value)
                    ttl_ms = _ms(expiry_s("usage", row, now, self.retention_days))
                    index = ledger_index(str(row["client"]))
                    pipe.zadd(index, {key: int(row["day"])})
                    pipe.sadd(LEDGER_CLIENTS, str(row["client"]))
                    pipe.pexpire(key, ttl_ms, nx=True)
                    for grouped in (index, LEDGER_CLIENTS):
                        pipe.pexpire(grouped, ttl_ms, nx=True)
                        pipe.pexpire(grouped, ttl_ms, gt=True)
                await pipe.execute()
        await self.client.set(LEDGER_INDEXED, "1")
        self._indexed = True

    async def _mget(self, keys: list[Any]) -> list[Any]:
        values: list[Any] = []
        for start in range(0, len(keys), MGET_CHUNK):
            values += await self.client.mget(keys[start:start + MGET_CHUNK])
        return values

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


def _row_of(section: str, prefix: str, key: bytes | str, value: bytes | str) -> dict[str, Any]:
    """A row from its Redis key (`prefix` + name + ':' + position) and stored JSON."""
    name, _, pos = _text(key)[len(prefix):].rpartition(":")
    fields = orjson.loads(value)
    if not isinstance(fields, dict):
        raise ValueError(f"limits row {section}:{name}:{pos} is not an object")
    return {**fields, "name": name, "key": int(pos)}


def import_rows(url: str, rows: Sequence[tuple[RowName, dict[str, Any]]], now: float,
                retention_days: int = RETENTION_DAYS) -> tuple[int, int, int]:
    """Write `rows` into the Redis store at `url` as its own rows (with their expiry and the
    ledger's index), leaving any row it holds already; (written, already there, past the
    ledger's retention). LimitsStoreError if it does not answer."""
    first_kept = int(now // DAY_S) - retention_days
    kept = [(n, r) for n, r in rows if n[0] != "usage" or int(r["day"]) >= first_kept]
    written = 0
    try:
        with redis.Redis.from_url(url, socket_timeout=ANSWER_TIMEOUT_S * 5,
                                  socket_connect_timeout=ANSWER_TIMEOUT_S) as client:
            for start in range(0, len(kept), MGET_CHUNK):
                chunk = kept[start:start + MGET_CHUNK]
                rows_pipe = client.pipeline(transaction=False)
                index_pipe = client.pipeline(transaction=False)
                for name, row in chunk:
                    ttl_ms = _ms(expiry_s(name[0], row, now, retention_days))
                    rows_pipe.set(redis_key(name), encode(row), px=ttl_ms or None, nx=True)
                    if name[0] == "usage":
                        index = ledger_index(str(row["client"]))
                        index_pipe.zadd(index, {redis_key(name): int(row["day"])})
                        index_pipe.sadd(LEDGER_CLIENTS, str(row["client"]))
                        for key in (index, LEDGER_CLIENTS):  # the longest row's expiry
                            index_pipe.pexpire(key, ttl_ms, nx=True)
                            index_pipe.pexpire(key, ttl_ms, gt=True)
                written += sum(bool(done) for done in rows_pipe.execute())
                index_pipe.execute()
    except redis.exceptions.RedisError as exc:
        raise LimitsStoreError(f"{url}: {exc}") from exc
    return written, len(kept) - written, len(rows) - len(kept)
