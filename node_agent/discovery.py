"""Tracker-side discovery: browse nodes and trackers over mDNS, health-check nodes.

Added/Updated/Removed node services become calls on a `TopologySink`; a node that misses
`MISSES_TO_REMOVE` probes in a row leaves the topology (no goodbye comes after a kill -9) and
comes back when it answers again. Hostile records are rejected through the sink, never trusted.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any, Protocol

import aiohttp
import anyio
import anyio.abc
from zeroconf import Error as ZeroconfError
from zeroconf import ServiceStateChange
from zeroconf.asyncio import AsyncServiceBrowser, AsyncServiceInfo, AsyncZeroconf

from meshroute_middleware.core import InvalidNodeError, NodeRecord
from meshroute_middleware.core.logsafe import shown

from .announcer import TrackerAnnouncer, parse_tracker
from .mdns import (
    NODE_SERVICE,
    RESOLVE_TIMEOUT_MS,
    TRACKER_SERVICE,
    decode_record,
    name_problem,
    open_zeroconf,
)

log = logging.getLogger("meshroute.discovery")

MISSES_TO_REMOVE = 3  # issue 4: "a node that misses 3 probes leaves the topology"
FORGET_AFTER_MISSES = 150  # stop probing a dead node after this many misses
HEALTH_INTERVAL_S = 2.0  # seconds between health probes of every node (its one home)
MAX_PROBE_TIMEOUT_S = 2.0
EVENT_BUFFER = 1024  # browse events waiting to be resolved; beyond, events are dropped
MAX_LOGGED_REJECTIONS = 1024  # distinct refusals logged; all are counted by the sink
MAX_CONCURRENT_PROBES = 64  # health probes in flight at once, whatever the mesh size

TrackerCallback = Callable[[str, int], object]  # (host, gossip_port); the result is ignored


class TopologySink(Protocol):
    """Where discovery puts what it learns (the gateway implements it over a Router)."""

    def upsert(self, record: NodeRecord, claim: str | None = None) -> str:
        """Join or refresh a node; return 'join', 'shard-change', 'refresh' or 'refused'.
        `claim` names an unsigned source (`mdns:<instance>`), None a trusted one; raise
        InvalidNodeError (counted by the sink) when the tracker holds too many nodes."""

    def remove(self, node_id: str, claim: str | None = None) -> bool:
        """Remove a node; return whether it was there. An unsigned `claim` removes only a
        node the same source created."""

    def nodes(self) -> list[NodeRecord]:
        """Every node currently in the topology."""

    def reject(self, source: str, reason: str, kind: str = "") -> None:
        """Count and log a refused record; `source` and `kind` (the metric's reason label)
        are fixed words, `reason` the text naming it."""


class Discovery:
    """The state of a tracker's discovery: which service is which node, health misses."""

    def __init__(self, sink: TopologySink, *, mesh_secret: str | None = None,
                 health_interval_s: float = HEALTH_INTERVAL_S, skip_tracker: str | None = None,
                 on_tracker: TrackerCallback | None = None,
                 on_tracker_gone: TrackerCallback | None = None) -> None:
        self.sink, self.mesh_secret = sink, mesh_secret
        self.health_interval_s = health_interval_s
        self.probe_timeout_s = min(health_interval_s, MAX_PROBE_TIMEOUT_S)
        self._skip_tracker = skip_tracker
        self._on_tracker, self._on_tracker_gone = on_tracker, on_tracker_gone
        self.services: dict[str, str] = {}  # node service name -> node_id
        self.trackers: dict[str, tuple[str, int]] = {}  # tracker service name -> peer
        self.misses: dict[str, int] = {}
        self.claims: dict[str, str | None] = {}  # node_id -> the claim it was accepted under
        self.down: dict[str, NodeRecord] = {}  # removed by health checks, still probed
        self._logged: set[tuple[str, str]] = set()
        self._probe_limit = anyio.CapacityLimiter(MAX_CONCURRENT_PROBES)
        self._send, self._receive = anyio.create_memory_object_stream[
            tuple[str, str, ServiceStateChange]](EVENT_BUFFER)

    # -- browsing --------------------------------------------------------------------
    def on_change(self, zeroconf: Any, service_type: str, name: str,
                  state_change: ServiceStateChange) -> None:
        """AsyncServiceBrowser handler: queue the event for the resolver task. A full queue
        (a flood of announcements) drops the event, counted as a rejection through the sink
        (meshroute_rejected{source="mdns-overflow"}). A name that may not be used (control
        characters, too long, another service type) is refused here, before anything reads it
        (meshroute_rejected{source="mdns",reason="bad_name"})."""
        source = "mdns-tracker" if service_type == TRACKER_SERVICE else "mdns"
        problem = (name_problem(name, service_type)
                   if service_type in (NODE_SERVICE, TRACKER_SERVICE) else "bad_type")
        if problem is not None:
            self._reject(source, name, "service name may not be used", problem)
            return
        try:
            self._send.send_nowait((service_type, name, state_change))
        except anyio.WouldBlock:
            self._reject("mdns-overflow", name, "browse event queue full; event dropped",
                         "overflow")

    async def handle_events(self, azc: AsyncZeroconf) -> None:
        """Resolve queued browse events in order, forever: no single event can end it (an
        unexpected error is refused as that event's, counted and logged once)."""
        async with self._receive:
            async for service_type, name, change in self._receive:
                try:
                    await self._event(azc, service_type, name, change)
                except Exception as exc:  # one hostile record, never the whole discovery
                    self._reject("mdns", name, f"{type(exc).__name__}: {exc}", "error")

    async def _event(self, azc: AsyncZeroconf, service_type: str, name: str,
                     change: ServiceStateChange) -> None:
        if service_type == NODE_SERVICE:
            await self._node_event(azc, name, change)
        elif service_type == TRACKER_SERVICE and name != self._skip_tracker:
            await self._tracker_event(azc, name, change)

    async def _resolve(self, azc: AsyncZeroconf, service_type: str,
                       name: str) -> AsyncServiceInfo | None:
        """The resolved service, or None; zeroconf's refusal of a name counts as None."""
        try:
            info = AsyncServiceInfo(service_type, name)
            if await info.async_request(azc.zeroconf, RESOLVE_TIMEOUT_MS):
                return info
        except ZeroconfError:  # BadTypeInNameException and kin: a name zeroconf refuses
            return None
        return None

    async def _node_event(self, azc: AsyncZeroconf, name: str,
                          change: ServiceStateChange) -> None:
        if change is ServiceStateChange.Removed:
            self.goodbye(name)
            return
        info = await self._resolve(azc, NODE_SERVICE, name)
        if info is None:
            self._reject("mdns", name, "service record could not be resolved", "unresolved")
            return
        self.announced(name, info.properties)

    def claim(self, name: str) -> str | None:
        """The source of a record from service instance `name`: None (trusted) when records
        must be signed with the mesh secret, else the unsigned claim `mdns:<instance>`."""
        return None if self.mesh_secret else f"mdns:{name}"

    def announced(self, name: str, properties: Any) -> None:
        """A node service's TXT record arrived (resolved): validate, then accept or refuse."""
        try:
            record = decode_record(properties, secret=self.mesh_secret)
            self._accept(name, record)
        except InvalidNodeError as exc:
            self._reject("mdns", name, str(exc), "bad_record")

    def goodbye(self, name: str) -> None:
        """A node service left: it removes only the node this same announcement created."""
        node_id = self.services.pop(name, None)
        if node_id is None:
            return
        claim = self.claim(name)
        if self.claims.get(node_id, claim) == claim:
            self._forget(node_id)
        if self.sink.remove(node_id, claim):
            log.info("node %s said goodbye", shown(node_id))

    def _reject(self, source: str, name: str, reason: str, kind: str) -> None:
        """Count every refusal through the sink; log each (service, reason) once."""
        self.sink.reject(source, f"{shown(name, 80)}: {reason}", kind)
        self._log_refusal(name, reason)

    def _accept(self, name: str, record: NodeRecord) -> None:
        claim = self.claim(name)
        if claim is not None and record.node_id in self.down \
                and self.claims.get(record.node_id) != claim:  # still reserved: probed
            self.sink.reject("mdns-claim", f"{record.node_id}: held by a node being probed",
                             "held")
            self._log_refusal(name, f"may not take node {record.node_id!r} while it is down")
            return
        old = self.services.get(name)
        if old is not None and old != record.node_id:  # re-registered under a new id
            self.goodbye(name)
        try:
            outcome = self.sink.upsert(record, claim)
        except InvalidNodeError as exc:  # counted by the sink (tracker full, --node-networks)
            self._log_refusal(name, str(exc))
            return
        if outcome == "refused":  # counted by the sink: another source owns this node id
            self._log_refusal(name, f"may not change node {record.node_id!r}")
            return
        if outcome != "refresh":  # the latest announcement owns the id: older names let go
            for other in [n for n, i in self.services.items() if i == record.node_id]:
                del self.services[other]
        self.services[name] = record.node_id
        self._forget(record.node_id)
        self.claims[record.node_id] = claim
        if outcome != "refresh":
            log.info("node %s %s via mDNS (%s)", shown(record.node_id), outcome,
                     shown(record.url))

    def _log_refusal(self, name: str, reason: str) -> None:
        key = (name[:80], reason)
        if key not in self._logged and len(self._logged) < MAX_LOGGED_REJECTIONS:
            self._logged.add(key)
            log.warning("refused mDNS record %s: %s", shown(name, 80), shown(reason))

    def _forget(self, node_id: str) -> None:
        self.misses.pop(node_id, None)
        self.down.pop(node_id, None)
        self.claims.pop(node_id, None)

    async def _tracker_event(self, azc: AsyncZeroconf, name: str,
                             change: ServiceStateChange) -> None:
        if change is ServiceStateChange.Removed:
            peer = self.trackers.pop(name, None)
            if peer is not None and self._on_tracker_gone is not None:
                self._on_tracker_gone(*peer)
            return
        info = await self._resolve(azc, TRACKER_SERVICE, name)
        try:
            if info is None:
                raise ValueError("service record could not be resolved")
            _, host, port = parse_tracker(info.properties, info.parsed_addresses(),
                                          self.mesh_secret)
        except ValueError as exc:
            self._reject("mdns-tracker", name, str(exc), "bad_record")
            return
        if self.trackers.get(name) != (host, port):
            self.trackers[name] = (host, port)
            if self._on_tracker is not None:
                self._on_tracker(host, port)

    # -- health ----------------------------------------------------------------------
    async def health_loop(self, session: aiohttp.ClientSession) -> None:
        """Probe every node each interval, forever."""
        while True:
            await anyio.sleep(self.health_interval_s)
            await self.probe_all(session)

    async def probe_all(self, session: aiohttp.ClientSession) -> None:
        """Probe the topology's nodes and the ones health checks removed, then apply results."""
        targets = {n.node_id: n for n in self.sink.nodes()}
        targets.update(self.down)
        answered: dict[str, bool] = {}

        async def probe(record: NodeRecord) -> None:
            async with self._probe_limit:
                answered[record.node_id] = await self.probe(session, record.url)

        async with anyio.create_task_group() as tg:
            for record in targets.values():
                tg.start_soon(probe, record)
        for node_id, ok in answered.items():
            self.apply_probe(targets[node_id], ok)

    async def probe(self, session: aiohttp.ClientSession, url: str) -> bool:
        """GET {url}/v1/models: any HTTP answer proves the process is up."""
        timeout = aiohttp.ClientTimeout(total=self.probe_timeout_s)
        try:
            async with session.get(url + "/v1/models", timeout=timeout) as resp:
                return resp.status > 0
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return False

    def _restore(self, record: NodeRecord) -> None:
        """A node removed by health checks answers again: back under the claim it had."""
        try:
            outcome = self.sink.upsert(record, self.claims.get(record.node_id))
        except InvalidNodeError as exc:  # counted by the sink
            log.warning("node %s answers again but is refused: %s", shown(record.node_id),
                        shown(exc))
            return
        if outcome != "refused":
            log.info("node %s answers again: back in the topology", shown(record.node_id))

    def apply_probe(self, record: NodeRecord, ok: bool) -> None:
        """Count a probe result: 3 misses remove the node, an answer brings it back."""
        node_id = record.node_id
        if ok:
            self.misses.pop(node_id, None)
            back = self.down.pop(node_id, None)
            if back is not None:
                self._restore(back)
            return
        misses = self.misses[node_id] = self.misses.get(node_id, 0) + 1
        if misses == MISSES_TO_REMOVE and node_id not in self.down:
            self.down[node_id] = record
            self.sink.remove(node_id)
            log.warning("node %s missed %d health probes: removed", shown(node_id), misses)
        elif misses >= FORGET_AFTER_MISSES:
            self._forget(node_id)


@asynccontextmanager
async def health_checks(sink: TopologySink, *,
                        health_interval_s: float = HEALTH_INTERVAL_S) -> AsyncIterator[Discovery]:
    """Health-check the topology's nodes without mDNS (nodes registered over HTTP or from a
    file): the same probes and rules as `tracker_discovery`, no browsing, no announcing."""
    discovery = Discovery(sink, health_interval_s=health_interval_s)
    async with aiohttp.ClientSession() as session, anyio.create_task_group() as tg:
        tg.start_soon(discovery.health_loop, session)
        try:
            yield discovery
        finally:
            tg.cancel_scope.cancel()


@asynccontextmanager
async def tracker_discovery(
    sink: TopologySink, *, interfaces: str = "all", mesh_secret: str | None = None,
    health_interval_s: float = HEALTH_INTERVAL_S, announce_http_port: int | None = None,
    announce_gossip_port: int | None = None, announce_host: str = "127.0.0.1",
    tracker_id: str | None = None, on_tracker: TrackerCallback | None = None,
    on_tracker_gone: TrackerCallback | None = None,
) -> AsyncIterator[Discovery]:
    """Browse nodes and trackers, health-check nodes, announce this tracker, until the exit."""
    announcer = None
    if announce_http_port is not None and announce_gossip_port is not None:
        announcer = TrackerAnnouncer(
            tracker_id or f"{socket.gethostname()}-{announce_http_port}", announce_http_port,
            announce_gossip_port, host=announce_host, interfaces=interfaces,
            mesh_secret=mesh_secret)
    discovery = Discovery(sink, mesh_secret=mesh_secret, health_interval_s=health_interval_s,
                          skip_tracker=announcer.instance if announcer else None,
                          on_tracker=on_tracker, on_tracker_gone=on_tracker_gone)
    azc = open_zeroconf(interfaces)
    try:
        async with aiohttp.ClientSession() as session, anyio.create_task_group() as tg:
            if announcer is not None:
                tg.start_soon(announcer.start)
            browser = AsyncServiceBrowser(azc.zeroconf, [NODE_SERVICE, TRACKER_SERVICE],
                                          handlers=[discovery.on_change])
            tg.start_soon(discovery.handle_events, azc)
            tg.start_soon(discovery.health_loop, session)
            try:
                yield discovery
            finally:
                tg.cancel_scope.cancel()
                with anyio.CancelScope(shield=True):
                    await browser.async_cancel()
    finally:
        with anyio.CancelScope(shield=True):
            if announcer is not None:
                await announcer.close()
            await azc.async_close()
