"""Announce a node (or a tracker) over mDNS; keep queue and tps current; say goodbye on exit."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from types import EllipsisType, TracebackType
from typing import Protocol

import anyio
from zeroconf import ServiceInfo
from zeroconf.asyncio import AsyncZeroconf

from meshroute_middleware.core import NodeRecord
from meshroute_middleware.core.cache_prior import CachePrior
from meshroute_middleware.core.contracts.txt import TxtProperties, decode_tracker, encode_tracker

from .mdns import NODE_SERVICE, TRACKER_SERVICE, encode_record, open_zeroconf, service_info

log = logging.getLogger("meshroute.node_agent")

UPDATE_MIN_INTERVAL_S = 1.0  # at most one TXT update a second: each one multicasts a packet
# ... but a change of the engine's load alone (`held`, with the `queue` that moves with it
# once its slots are full) goes out within a quarter second: trackers take it as the
# requests others sent (core/node_load.py), and a second-old count on a node serving
# answers of a few seconds misleads them (docs/architecture.md, "One node, several
# trackers"; issue 31: "within a fraction of a second").
HELD_MIN_INTERVAL_S = 0.25
TPS_CHANGE_SHARE = 0.10  # a tps change below 10 % is noise, not news
CACHE_HIT_CHANGE = 0.05  # nor is a prefix-cache hit rate moving by less than 5 points
LOAD_POLL_S = 0.25


def meaningful_change(old: NodeRecord, new: NodeRecord,
                      tps_share: float = TPS_CHANGE_SHARE) -> bool:
    """Whether `new` differs from what was announced enough to announce again."""
    if replace(old, queue=new.queue, tps=new.tps) != new:
        return True
    return old.queue != new.queue or abs(new.tps - old.tps) > tps_share * old.tps


def announced_cache(old: CachePrior | None, new: CachePrior | None) -> CachePrior | None:
    """The cache report to announce: `new` rounded, or `old` when they differ only by noise
    (a hit rate within 0.05, held tokens within 10 %), so that a drifting rate does not
    multicast a packet a second."""
    if new is None or old is None:
        return _rounded(new)
    if new.hit_rate is not None and old.hit_rate is not None \
            and abs(new.hit_rate - old.hit_rate) < CACHE_HIT_CHANGE \
            and (new.cached_tokens is None) == (old.cached_tokens is None) \
            and (new.cached_tokens is None or old.cached_tokens is None
                 or abs(new.cached_tokens - old.cached_tokens)
                 <= TPS_CHANGE_SHARE * old.cached_tokens):
        return old
    return _rounded(new)


def _rounded(prior: CachePrior | None) -> CachePrior | None:
    if prior is None or prior.hit_rate is None:
        return prior
    return prior._replace(hit_rate=round(prior.hit_rate, 2))


def next_record(record: NodeRecord, queue: int, tps: float,
                cache: CachePrior | EllipsisType | None = ...,
                slots: int | EllipsisType | None = ...,
                held: int | EllipsisType | None = ...) -> NodeRecord:
    """`record` with new load, and the server's cache report, slot count and running plus
    waiting requests where given."""
    new = replace(record, queue=queue, tps=round(tps, 3))
    if not isinstance(held, EllipsisType):
        new = replace(new, held=held)
    if not isinstance(cache, EllipsisType):
        new = replace(new, cache=announced_cache(record.cache, cache))
    if not isinstance(slots, EllipsisType):
        new = replace(new, slots=slots)
    return new


def min_interval(old: NodeRecord, new: NodeRecord, interval_s: float) -> float:
    """The seconds to keep between publications before `new` may follow `old`: the
    shorter HELD_MIN_INTERVAL_S when only the engine's load changed (`held`, and the
    `queue` beside it: the waiting requests are part of the load; a speed that moved by
    less than TPS_CHANGE_SHARE is re-measured noise, not a change of its own)."""
    if old.held != new.held and replace(old, held=new.held, queue=new.queue,
                                        tps=new.tps) == new \
            and abs(new.tps - old.tps) <= TPS_CHANGE_SHARE * old.tps:
        return min(interval_s, HELD_MIN_INTERVAL_S)
    return interval_s


class Publisher(Protocol):
    """What keeps a node's record known: the mDNS announcer, the HTTP registrar."""

    async def refresh(self, queue: int, tps: float,
                      cache: CachePrior | EllipsisType | None = ...,
                      slots: int | EllipsisType | None = ...,
                      held: int | EllipsisType | None = ...) -> bool: ...


async def follow(publishers: Sequence[Publisher], load: Callable[[], tuple[int, float]],
                 poll_s: float = LOAD_POLL_S,
                 cache: Callable[[], CachePrior | None] | None = None,
                 slots: Callable[[], int | None] | None = None,
                 held: Callable[[], int | None] | None = None) -> None:
    """Poll `load()` -> (queue, tps) (and `cache()`, the server's prefix-cache report,
    `slots()`, its slot count, and `held()`, its running plus waiting requests) forever,
    refreshing every publisher's record."""
    while True:
        await anyio.sleep(poll_s)
        queue, tps = load()
        got_cache = ... if cache is None else cache()
        got_slots = ... if slots is None else slots()
        got_held = ... if held is None else held()
        for publisher in publishers:
            await publisher.refresh(queue, tps, got_cache, got_slots, got_held)


class _Registered:
    """One registered mDNS service on its own AsyncZeroconf; unregistered with a goodbye."""

    def __init__(self, interfaces: str) -> None:
        self._interfaces = interfaces
        self._zc: AsyncZeroconf | None = None
        self._info: ServiceInfo | None = None

    async def register(self, info: ServiceInfo) -> None:
        self._zc = open_zeroconf(self._interfaces)
        self._info = info
        await (await self._zc.async_register_service(info))  # strict: RFC 6335 names only

    async def update(self, info: ServiceInfo) -> None:
        assert self._zc is not None
        self._info = info
        await (await self._zc.async_update_service(info))

    async def close(self) -> None:
        """Unregister (the goodbye packet) and close; safe to call twice."""
        zc, info, self._zc, self._info = self._zc, self._info, None, None
        if zc is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                if info is not None:
                    await (await zc.async_unregister_service(info))
            finally:
                await zc.async_close()


class NodeAnnouncer:
    """Registers a node record as `_meshroute._tcp.local.` and keeps it current."""

    def __init__(self, record: NodeRecord, *, interfaces: str = "all",
                 mesh_secret: str | None = None,
                 min_interval_s: float = UPDATE_MIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.record = record
        self._secret, self._interfaces = mesh_secret, interfaces
        self._min_interval_s, self._clock = min_interval_s, clock
        self._service = _Registered(interfaces)
        self._updated_at = float("-inf")
        self._serial = 0

    def _info(self, record: NodeRecord) -> ServiceInfo:
        self._serial += 1  # each update's TXT differs from every earlier one
        return service_info(NODE_SERVICE, record.node_id, record.url,
                            encode_record(record, self._secret, self._serial),
                            self._interfaces)

    async def start(self) -> None:
        """Register the record (mDNS probing takes about a second)."""
        await self._service.register(self._info(self.record))
        self._updated_at = self._clock()

    async def refresh(self, queue: int, tps: float,
                      cache: CachePrior | EllipsisType | None = ...,
                      slots: int | EllipsisType | None = ...,
                      held: int | EllipsisType | None = ...) -> bool:
        """Announce new load (and the server's cache report, slot count and held requests,
        where given) if it changed meaningfully and the rate limit allows; say if sent."""
        new = next_record(self.record, queue, tps, cache, slots, held)
        if not meaningful_change(self.record, new):
            return False
        if self._clock() - self._updated_at < min_interval(self.record, new,
                                                            self._min_interval_s):
            return False  # the next refresh after the interval sends it
        await self._service.update(self._info(new))
        self.record, self._updated_at = new, self._clock()
        return True

    async def follow(self, load: Callable[[], tuple[int, float]],
                     poll_s: float = LOAD_POLL_S,
                     cache: Callable[[], CachePrior | None] | None = None,
                     slots: Callable[[], int | None] | None = None,
                     held: Callable[[], int | None] | None = None) -> None:
        """Poll `load()` -> (queue, tps) (and `cache()`, the server's prefix-cache report,
        `slots()`, its slot count, and `held()`) forever, refreshing the announcement."""
        await follow([self], load, poll_s, cache, slots, held)

    async def close(self) -> None:
        """Unregister with a goodbye."""
        await self._service.close()

    async def __aenter__(self) -> NodeAnnouncer:
        await self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()


def parse_tracker(properties: TxtProperties, addresses: list[str],
                  secret: str | None = None) -> tuple[str, str, int]:
    """(tracker_id, host, gossip_port) from a tracker's TXT and addresses; ValueError else."""
    txt = decode_tracker(properties, secret=secret)
    if not addresses:
        raise ValueError("tracker record has no address")
    return txt.tracker_id, addresses[0], txt.gossip_port


class TrackerAnnouncer:
    """Registers this tracker as `_meshroute-trk._tcp.local.` for zero-config gossip."""

    def __init__(self, tracker_id: str, http_port: int, gossip_port: int, *,
                 host: str = "127.0.0.1", interfaces: str = "all",
                 mesh_secret: str | None = None) -> None:
        self.tracker_id = tracker_id
        props = encode_tracker(tracker_id, http_port, gossip_port, mesh_secret)
        self._info = service_info(TRACKER_SERVICE, tracker_id, f"http://{host}:{http_port}",
                                  props, interfaces)
        self._service = _Registered(interfaces)

    @property
    def instance(self) -> str:
        """This tracker's service instance name (so a browser can skip itself)."""
        return str(self._info.name)

    async def start(self) -> None:
        """Register the tracker service."""
        await self._service.register(self._info)

    async def close(self) -> None:
        """Unregister with a goodbye."""
        await self._service.close()
