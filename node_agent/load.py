"""A real inference engine's live load, read from its own pages, as the node's announcement.

`meshroute node` fronting llama.cpp's server, vLLM, SGLang or TGI (`--load-from`, default
auto) polls the engine's pages (node_agent/engines.py says which, and which fields) and
announces what they mean (docs/architecture.md, "What a node agent reads"):

- `queue`: the requests waiting (llama.cpp deferred, vLLM waiting, SGLang queued);
- `held`: those and the running ones, every sender's, read every 0.25 s: what trackers
  count as the node's load beyond their own requests (core/node_load.py);
- `tps`: tokens/s of one request, from the engine's decode counters over a window of at
  least 32 tokens and 1 s of decoding (node_agent/windows.py); until one has closed, the
  configured figure (`--tps`); a counter going backwards (a restart) drops the window and
  keeps the last figure; idle keeps it too;
- `slots`: the requests it runs at once, where it says (llama.cpp `/props` `total_slots` or
  its `/slots` list; SGLang `max_running_requests`), core/slot_count.py;
- `cache_hit` / `cache_tokens` (core/cache_prior.py), only where the engine says something
  that means them: a hit rate from its prefix-cache counters over at least 512 queried
  prompt tokens (vLLM, llama.cpp, SGLang's `prefill_effective_tokens_total`), or the
  engine's own hit-rate gauge where it has no counters (older SGLang, vLLM V0), announced
  once a window found hits and dropped at a restart (the new process's cache is empty); 0
  only where the engine says prefix caching is off (vLLM's `cache_config_info`); the tokens
  one slot holds from llama.cpp's context (`n_ctx`).

Malformed cache or context fields give no figure and are counted (`LoadReader.rejected`) and
logged; the load part is read as before. The parsing is pure; `LoadReader` is the thin
HTTP poller around it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import aiohttp
import anyio

from meshroute_middleware.core.cache_prior import CachePrior
from meshroute_middleware.core.contracts.load import MAX_HELD
from meshroute_middleware.core.errors import InvalidNodeError
from meshroute_middleware.core.slot_count import slot_count

from .engines import (
    SOURCES,
    EngineReading,
    LoadFormatError,
    MetricsPage,
    busy_slots,
    detect,
    llamacpp_reading,
    parse_json,
    read_metrics,
    sglang_reading,
    slots_needed,
    tgi_reading,
    vllm_reading,
)
from .windows import HitWindow, SpeedWindow

log = logging.getLogger("meshroute.node_agent")

LOAD_SOURCES = ("auto", *SOURCES, "none")
# How often the server's pages are read: its running and waiting requests are announced as
# `held` (core/node_load.py), which trackers read as the load others put on it.
POLL_S = 0.25
TIMEOUT_S = 2.0
MAX_PAGE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """What the node takes from one read: the load now and the figures to announce (speed
    in tokens/s of one request, None while no window has closed)."""

    source: str
    running: int
    waiting: int
    slots: int | None = None  # how many requests it runs at once, where it says
    tokens_per_s: float | None = None
    cache: CachePrior | None = None  # its prefix cache, where it says something of it
    kv_cache_usage: float | None = None  # read, not announced: a fill level, not a prior


def server_base(url: str) -> str:
    """The server's root URL from the node's OpenAI base URL (a trailing /v1 dropped)."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def engine_reading(source: str, page: MetricsPage | None, slots: Any = None,
                   props: Any = None) -> EngineReading | None:
    """The reading of `source`'s pages; None when the pages it needs are missing."""
    if source == "llamacpp":
        return llamacpp_reading(page, slots, props)
    if page is None:
        return None
    reader = {"vllm": vllm_reading, "sglang": sglang_reading, "tgi": tgi_reading}[source]
    return reader(page)


class LoadReader:
    """Polls an engine's pages and keeps the latest load; `announcement()` gives what the
    node announces: (queue, tokens/s), the speed falling back to the configured figure."""

    def __init__(self, url: str, source: str, default_tps: float,
                 poll_s: float = POLL_S, *, api_key: str | None = None) -> None:
        if source not in LOAD_SOURCES:
            raise ValueError(f"--load-from must be one of {', '.join(LOAD_SOURCES)}")
        self.base = server_base(url)
        self.source = source  # "auto" until detected
        self.default_tps = default_tps
        self.poll_s = poll_s
        self.latest: ServerLoad | None = None
        self.speed = SpeedWindow()
        self.hits = HitWindow()
        self._props: Any = None  # llama.cpp's /props, read once and after a restart
        # the server's own key (--api-key-env): llama.cpp guards /metrics and /slots with it
        self._headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        self.rejected = 0  # pages whose cache fields, context or slot count were malformed

    def announcement(self) -> tuple[int, float]:
        """(queue, tokens/s) to announce now."""
        latest = self.latest
        tps = self.speed.tokens_per_s
        return (0 if latest is None else latest.waiting), \
            (self.default_tps if tps is None else tps)

    def cache_prior(self) -> CachePrior | None:
        """The engine's prefix-cache report to announce now (None: it says nothing)."""
        latest = self.latest
        return None if latest is None else latest.cache

    def held(self) -> int | None:
        """The engine's running plus waiting requests, every sender's, to announce now
        (None before its first read)."""
        latest = self.latest
        return None if latest is None else min(latest.running + latest.waiting, MAX_HELD)

    def slot_count(self) -> int | None:
        """The engine's slot count to announce now (None: it gives none)."""
        latest = self.latest
        return None if latest is None else latest.slots

    def take(self, page: MetricsPage | None, slots: Any = None,
             props: Any = None) -> ServerLoad | None:
        """Fold one read (a /metrics page, /slots and /props documents, any None) in."""
        source = self.source
        if source == "auto":
            source = (detect(page.sums) if page is not None else None) or (
                "llamacpp" if slots is not None or props is not None else "auto")
            if source == "auto":
                return None
            log.info("load: %s looks like %s", self.base, source)
            self.source = source
        reading = engine_reading(source, page, slots, props)
        if reading is None:
            return None
        for why in reading.refused:
            self._refuse("field refused", why)
        restarts = self.speed.restarts + self.hits.restarts
        if reading.decode is not None:
            if reading.decode_min_tokens is not None:
                self.speed.min_part, self.speed.min_whole = reading.decode_min_tokens, 0.0
            try:
                self.speed.add(reading.decode)
            except ValueError as exc:
                log.warning("load: %s: decode counters refused: %s", self.base, exc)
            if self.speed.restarts + self.hits.restarts != restarts:
                self.hits.hit_rate = None  # a new process: the old cache's rate is gone
        load = ServerLoad(reading.source, reading.running, reading.waiting,
                          self._slot_count(reading.slots), self.speed.tokens_per_s,
                          self._cache(reading), reading.kv_cache_usage)
        if self.speed.restarts + self.hits.restarts != restarts:
            log.info("load: %s: counters went backwards: a restart", self.base)
            self._props = None  # its context or slots may have changed with it
        self.latest = load
        return load

    def _cache(self, reading: EngineReading) -> CachePrior | None:
        """The cache prior this reading supports; a malformed one is dropped and counted."""
        hit_rate: float | None = None
        if reading.caching_off:
            hit_rate = 0.0
        elif reading.cache is not None:
            try:
                hit_rate = self.hits.add(reading.cache)
            except ValueError as exc:
                self._refuse("cache counters refused", str(exc))
                hit_rate = None
        elif reading.cache_hit_gauge is not None:
            self.hits.hit_rate = reading.cache_hit_gauge
            hit_rate = reading.cache_hit_gauge
        else:
            hit_rate = self.hits.hit_rate
        if hit_rate is None and reading.context_tokens is None:
            return None
        return CachePrior(hit_rate, reading.context_tokens)

    def _refuse(self, what: str, why: str) -> None:
        self.rejected += 1
        log.warning("load: %s: %s: %s", self.base, what, why)

    def _slot_count(self, count: int | None) -> int | None:
        """A page's slot count, bounded; one out of range is dropped, counted and logged."""
        if count is None:
            return None
        try:
            return slot_count(count, "the engine's slot count")
        except InvalidNodeError as exc:
            self._refuse("slot count refused", str(exc))
            return None

    async def read_once(self, session: aiohttp.ClientSession) -> ServerLoad | None:
        """GET the pages this source exports and fold them in; None if nothing usable."""
        page = slots = None
        text = await self._get(session, "/metrics")
        if text is not None:
            try:
                page = read_metrics(text)
            except LoadFormatError as exc:
                log.warning("load: %s/metrics: %s", self.base, exc)
        detected = detect(page.sums) if page is not None else None
        if self.source in ("auto", "llamacpp") and detected in (None, "llamacpp"):
            if self._props is None:
                self._props = await self._json(session, "/props", _props_object)
            if slots_needed(page, self._props):
                slots = await self._json(session, "/slots", busy_slots)
        return self.take(page, slots, self._props)

    async def _json(self, session: aiohttp.ClientSession, path: str,
                    check: Any) -> Any:
        """A JSON page checked by `check` (LoadFormatError: logged, None)."""
        text = await self._get(session, path)
        if text is None:
            return None
        try:
            document = parse_json(text, path)
            check(document)
        except LoadFormatError as exc:
            log.warning("load: %s%s: %s", self.base, path, exc)
            return None
        return document

    async def _get(self, session: aiohttp.ClientSession, path: str) -> str | None:
        try:
            timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
            async with session.get(self.base + path, timeout=timeout,
                                   headers=self._headers) as resp:
                if resp.status != 200:
                    return None
                body = await resp.content.read(MAX_PAGE_BYTES)
                return body.decode("utf-8", "replace")
        except (aiohttp.ClientError, TimeoutError, OSError):
            return None

    async def run(self) -> None:
        """Poll forever (cancel to stop)."""
        async with aiohttp.ClientSession() as session:
            while True:
                await self.read_once(session)
                await anyio.sleep(self.poll_s)


def _props_object(props: Any) -> None:
    if not isinstance(props, dict):
        raise LoadFormatError("/props is not an object")
