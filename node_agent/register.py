"""Register a node with trackers over HTTP (`meshroute node --register URL`), for networks
without multicast: POST /v1/nodes with the record, again while it lives, DELETE on exit.

The tracker's side is the one POST /v1/nodes of every node writer (docs/security.md, "Who may
change the mesh"): JSON (`content-type: application/json`, which the tracker's guard
requires of every write), and the tracker's node token as a bearer token when it has one
(without one it takes node writes from loopback clients only).

The record is posted at start (retried every RETRY_S until a tracker takes it), when its
announced load changes (the mDNS announcer's rule: `announcer.meaningful_change`, at most
once a second), and every REFRESH_S whatever happens, so a tracker that restarted, or whose
health checks dropped the node, has it back within that time. A tracker that cannot be
reached is said once (on stdout, as the node's other lines) until it answers again; it never
stops the node.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from types import EllipsisType
from urllib.parse import quote, urlsplit

import aiohttp
import anyio

from meshroute_middleware.core import NodeRecord
from meshroute_middleware.core.cache_prior import CachePrior

from .announcer import UPDATE_MIN_INTERVAL_S, meaningful_change, min_interval, next_record

log = logging.getLogger("meshroute.node_agent")

REFRESH_S = 10.0  # the record is posted at least this often (a restarted tracker relearns it)
RETRY_S = 1.0  # a tracker that has not taken the record yet is tried again this often
TIMEOUT_S = 5.0  # one POST or DELETE, start to end


def parse_trackers(values: Sequence[str]) -> tuple[str, ...]:
    """The trackers' base URLs from repeated and comma-separated `--register` values;
    ValueError names a value that is not an http(s) URL."""
    out: list[str] = []
    for value in values:
        for part in (p.strip() for p in value.split(",")):
            if not part:
                continue
            parts = urlsplit(part)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                raise ValueError(f"--register needs a tracker's http(s) base URL, got {part!r}")
            base = part.rstrip("/").removesuffix("/v1/nodes").removesuffix("/v1")
            if base not in out:
                out.append(base)
    return tuple(out)


class HttpRegistrar:
    """Keeps one node record registered with each tracker in `trackers`."""

    def __init__(self, record: NodeRecord, trackers: Sequence[str], *,
                 token: str | None = None, refresh_s: float = REFRESH_S,
                 retry_s: float = RETRY_S, min_interval_s: float = UPDATE_MIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.record = record
        self.trackers = tuple(trackers)
        self._token = token
        self._refresh_s, self._retry_s = refresh_s, retry_s
        self._min_interval_s, self._clock = min_interval_s, clock
        self._posted_at = float("-inf")
        self.registered: set[str] = set()  # trackers whose last POST succeeded
        self._failing: set[str] = set()  # trackers whose failure was logged already
        self._session: aiohttp.ClientSession | None = None

    def _headers(self) -> dict[str, str]:
        headers = {"content-type": "application/json"}
        if self._token:
            headers["authorization"] = f"Bearer {self._token}"
        return headers

    async def start(self) -> None:
        """Open the session and post the record to every tracker once (no wait for success:
        `run` retries whoever did not take it)."""
        # a connection per request: behind `meshroute serve --workers N` (one port, the
        # kernel spreading connections) each POST may reach another worker, so every worker
        # learns the node over successive refreshes; a kept-alive connection would hold one
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S),
                                              connector=aiohttp.TCPConnector(force_close=True))
        await self.post_all()

    async def post_all(self) -> None:
        """POST the current record to every tracker."""
        self._posted_at = self._clock()
        for tracker in self.trackers:
            await self._post(tracker)

    async def _post(self, tracker: str) -> None:
        assert self._session is not None
        try:
            async with self._session.post(f"{tracker}/v1/nodes", json=self.record.to_dict(),
                                          headers=self._headers()) as resp:
                text = (await resp.text())[:200]
                if resp.status in (200, 201):
                    self._succeeded(tracker)
                    return
                self._failed(tracker, f"answered {resp.status}: {text}")
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self._failed(tracker, f"cannot be reached ({exc.__class__.__name__}: {exc})")

    def _succeeded(self, tracker: str) -> None:
        if tracker not in self.registered:
            print(f"meshroute node: registered {self.record.node_id} with {tracker}",
                  flush=True)
        self.registered.add(tracker)
        self._failing.discard(tracker)

    def _failed(self, tracker: str, why: str) -> None:
        self.registered.discard(tracker)
        if tracker not in self._failing:  # once until it answers again
            self._failing.add(tracker)
            print(f"meshroute node: tracker {tracker} {why}; retrying every {self._retry_s:g} s",
                  flush=True)

    async def refresh(self, queue: int, tps: float,
                      cache: CachePrior | EllipsisType | None = ...,
                      slots: int | EllipsisType | None = ...,
                      held: int | EllipsisType | None = ...) -> bool:
        """Post new load (and cache report, slot count and held requests, where given) if
        it changed meaningfully and the rate limit allows; say if sent."""
        new = next_record(self.record, queue, tps, cache, slots, held)
        if not meaningful_change(self.record, new):
            return False
        if self._clock() - self._posted_at < min_interval(self.record, new,
                                                           self._min_interval_s):
            return False  # the next refresh after the interval sends it
        self.record = new
        await self.post_all()
        return True

    async def run(self) -> None:
        """Forever: retry trackers that have not taken the record, and post it to all every
        `refresh_s`."""
        while True:
            await anyio.sleep(self._retry_s)
            if self._clock() - self._posted_at >= self._refresh_s:
                await self.post_all()
                continue
            for tracker in self.trackers:
                if tracker not in self.registered:
                    await self._post(tracker)

    async def close(self) -> None:
        """DELETE the node from every tracker (shielded: it runs while the node exits)."""
        session, self._session = self._session, None
        if session is None:
            return
        with anyio.CancelScope(shield=True):
            try:
                for tracker in self.trackers:
                    url = f"{tracker}/v1/nodes/{quote(self.record.node_id, safe='')}"
                    try:
                        async with session.delete(url, headers=self._headers()) as resp:
                            if resp.status not in (200, 404):
                                log.warning("tracker %s answered %d to the node's DELETE",
                                            tracker, resp.status)
                    except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                        log.warning("tracker %s: the node's DELETE failed (%s)", tracker, exc)
            finally:
                await session.close()
