"""A real inference server's live load, read from what it exports, as the node's announcement.

`meshroute node` fronting vLLM, llama.cpp's server or TGI announces the server's own queue
and per-request generation speed instead of a fixed `--tps` and queue 0 (`--load-from`):

- vLLM `/metrics`: `vllm:num_requests_running`, `vllm:num_requests_waiting`, and the speed
  from `vllm:time_per_output_token_seconds` (histogram: Δcount / Δsum between two reads);
- llama.cpp `/metrics` (server started with `--metrics`): `llamacpp:requests_processing`,
  `llamacpp:requests_deferred`, speed from `llamacpp:tokens_predicted_total` over
  `llamacpp:tokens_predicted_seconds_total`; else `/slots` (`is_processing`, or the older
  `state` 1) for the running count and the slot count;
- TGI `/metrics`: `tgi_queue_size`, `tgi_batch_current_size`, speed from
  `tgi_request_mean_time_per_token_duration` (histogram, as vLLM's).

Where the server exports its prefix cache, the node announces it too (core/cache_prior.py):
vLLM's `vllm:prefix_cache_hits` / `vllm:prefix_cache_queries` counters (tokens; Δ between
two reads), or the older gauge `vllm:gpu_prefix_cache_hit_rate`; llama.cpp's `/slots`
`n_prompt_tokens_cache` over `n_prompt_tokens` per slot (newer servers), or the older
`n_past` (tokens held, no hit rate). A page whose cache fields are malformed gives no prior
and is counted (`LoadReader.rejected`) and logged; the load part is read as before.

llama.cpp's `/slots` also gives the server's slot count (the requests it runs at once), which
the node announces as its `slots` (core/slot_count.py) unless the operator states one with
`--slots`; a count outside 1..MAX_SLOTS (an empty list) is not announced, counted and logged.

The parsing is pure (text in, `ServerLoad` out); `LoadReader` is the thin HTTP poller.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
import anyio

from meshroute_middleware.core.cache_prior import MAX_CACHE_TOKENS, CachePrior
from meshroute_middleware.core.errors import InvalidNodeError, MeshRouteError
from meshroute_middleware.core.slot_count import slot_count

log = logging.getLogger("meshroute.node_agent")

LOAD_SOURCES = ("auto", "vllm", "llamacpp", "tgi", "none")
POLL_S = 1.0  # how often the server's metrics are read
TIMEOUT_S = 2.0
MAX_PAGE_BYTES = 4 * 1024 * 1024
Metrics = dict[str, float]  # metric name -> value summed over its label sets


@dataclass(frozen=True, slots=True)
class ServerLoad:
    """What a server says about its load; speed in tokens/s of one request, None if unknown."""

    source: str
    running: int
    waiting: int
    slots: int | None = None  # how many requests it runs at once, where it says
    tokens_per_s: float | None = None
    cache: CachePrior | None = None  # its prefix cache, where it exports it


class LoadFormatError(MeshRouteError, ValueError):
    """A page that is not the metrics or slots document it claims to be."""


def parse_prometheus(text: str) -> Metrics:
    """Prometheus text exposition -> {name: value summed over label sets} (histogram series
    keep their `_sum` / `_count` / `_bucket` names; buckets are summed too, and unused)."""
    out: Metrics = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if "{" in line:
            name, rest = line.split("{", 1)
            close = rest.rfind("}")
            if close < 0:
                raise LoadFormatError(f"unclosed label set: {line[:80]!r}")
            fields = rest[close + 1:].split()
        else:
            name, *fields = line.split()
        if not fields:
            raise LoadFormatError(f"sample without a value: {line[:80]!r}")
        try:
            value = float(fields[0])
        except ValueError:
            raise LoadFormatError(f"bad sample value: {line[:80]!r}") from None
        name = name.strip()
        out[name] = out.get(name, 0.0) + value
    return out


def detect(metrics: Mapping[str, float]) -> str | None:
    """Which server exported these metrics: "vllm", "llamacpp", "tgi" or None."""
    for prefix, source in (("vllm:", "vllm"), ("llamacpp:", "llamacpp"), ("tgi_", "tgi")):
        if any(name.startswith(prefix) for name in metrics):
            return source
    return None


def _count(metrics: Mapping[str, float], name: str) -> int:
    value = metrics.get(name, 0.0)
    return int(value) if math.isfinite(value) and value > 0 else 0


def _histogram_tps(now: Mapping[str, float], before: Mapping[str, float] | None,
                   name: str) -> float | None:
    """Tokens/s from a seconds-per-token histogram: Δcount / Δsum since `before` (the whole
    history on the first read); None when no token was observed in between."""
    total, count = now.get(name + "_sum"), now.get(name + "_count")
    if total is None or count is None:
        return None
    if before is not None:
        total -= before.get(name + "_sum", 0.0)
        count -= before.get(name + "_count", 0.0)
    return count / total if total > 0 and count > 0 else None


def _ratio_tps(now: Mapping[str, float], before: Mapping[str, float] | None, tokens: str,
               seconds: str) -> float | None:
    """Tokens/s from a token counter over a seconds counter, as _histogram_tps."""
    n, s = now.get(tokens), now.get(seconds)
    if n is None or s is None:
        return None
    if before is not None:
        n -= before.get(tokens, 0.0)
        s -= before.get(seconds, 0.0)
    return n / s if s > 0 and n > 0 else None


def vllm_load(now: Mapping[str, float], before: Mapping[str, float] | None = None) -> ServerLoad:
    """vLLM's load from its /metrics (and the previous read, for the speed)."""
    return ServerLoad("vllm", _count(now, "vllm:num_requests_running"),
                      _count(now, "vllm:num_requests_waiting"), None,
                      _histogram_tps(now, before, "vllm:time_per_output_token_seconds"))


# vLLM's prefix-cache counters (prompt tokens) by version: the prometheus client exports a
# counter `x` as `x_total`; the V1 engine's are `vllm:prefix_cache_*`, some releases had
# `vllm:gpu_prefix_cache_*`. The V0 engine exported a gauge `vllm:gpu_prefix_cache_hit_rate`.
VLLM_CACHE_COUNTERS = (("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
                       ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
                       ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"),
                       ("vllm:gpu_prefix_cache_hits", "vllm:gpu_prefix_cache_queries"))
VLLM_HIT_RATE_GAUGE = "vllm:gpu_prefix_cache_hit_rate"


def vllm_cache(now: Mapping[str, float],
               before: Mapping[str, float] | None = None) -> CachePrior | None:
    """vLLM's prefix-cache hit rate: Δhits / Δqueries since `before` (the whole history on
    the first read), else its hit-rate gauge; None when nothing was queried or it exports
    none; LoadFormatError for counts no server writes (hits above queries, not finite)."""
    for hits_name, queries_name in VLLM_CACHE_COUNTERS:
        hits, queries = now.get(hits_name), now.get(queries_name)
        if hits is None or queries is None:
            continue
        if before is not None and hits_name in before and queries_name in before:
            hits, queries = hits - before[hits_name], queries - before[queries_name]
        if not (math.isfinite(hits) and math.isfinite(queries)):
            raise LoadFormatError(f"{hits_name} / {queries_name} are not finite")
        if queries <= 0 or hits < 0:  # nothing queried, or counters reset (a restart)
            return None
        if hits > queries:
            raise LoadFormatError(f"{hits_name} ({hits:g}) above {queries_name} ({queries:g})")
        return CachePrior(hits / queries)
    rate = now.get(VLLM_HIT_RATE_GAUGE)
    if rate is None:
        return None
    if not (math.isfinite(rate) and 0.0 <= rate <= 1.0):
        raise LoadFormatError(f"{VLLM_HIT_RATE_GAUGE} {rate:g} is not a rate in [0, 1]")
    return CachePrior(rate)


def tgi_load(now: Mapping[str, float], before: Mapping[str, float] | None = None) -> ServerLoad:
    """TGI's load from its /metrics (and the previous read, for the speed)."""
    return ServerLoad("tgi", _count(now, "tgi_batch_current_size"),
                      _count(now, "tgi_queue_size"), None,
                      _histogram_tps(now, before, "tgi_request_mean_time_per_token_duration"))


def llamacpp_load(now: Mapping[str, float] | None, slots: Any = None,
                  before: Mapping[str, float] | None = None) -> ServerLoad:
    """llama.cpp server's load from /metrics and/or /slots (either may be missing)."""
    running, slot_count = 0, None
    if slots is not None:
        running, slot_count = _busy_slots(slots)
    if now is None:
        return ServerLoad("llamacpp", running, 0, slot_count)
    if "llamacpp:requests_processing" in now:
        running = _count(now, "llamacpp:requests_processing")
    tps = _ratio_tps(now, before, "llamacpp:tokens_predicted_total",
                     "llamacpp:tokens_predicted_seconds_total")
    return ServerLoad("llamacpp", running, _count(now, "llamacpp:requests_deferred"),
                      slot_count, tps)


def server_cache(source: str, metrics: Mapping[str, float] | None, slots: Any,
                 before: Mapping[str, float] | None = None) -> CachePrior | None:
    """The prefix-cache prior a server's pages give (vLLM: /metrics; llama.cpp: /slots);
    LoadFormatError if their cache fields are malformed."""
    if source == "vllm" and metrics is not None:
        return vllm_cache(metrics, before)
    if source == "llamacpp" and slots is not None:
        return llamacpp_cache(slots)
    return None


def _slot_tokens(slot: Mapping[str, Any], key: str) -> int | None:
    """A slot's token count, bounded; None if absent; LoadFormatError if not a count."""
    value = slot.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) \
            or not 0 <= value <= MAX_CACHE_TOKENS:
        raise LoadFormatError(f"/slots '{key}' is not a token count: {str(value)[:32]!r}")
    return value


def llamacpp_cache(slots: Any) -> CachePrior | None:
    """llama.cpp's prefix cache from /slots: Σ `n_prompt_tokens_cache` / Σ `n_prompt_tokens`
    over the slots' last prompts, and the most tokens a slot holds (`n_prompt_tokens`, or
    the older `n_past`, at the slot's top level or in `next_token`); None if it says none."""
    if not isinstance(slots, list) or not all(isinstance(s, dict) for s in slots):
        raise LoadFormatError("/slots is not a list of slot objects")
    cached = prompt = 0
    held: int | None = None
    for slot in slots:
        n_cache, n_prompt = (_slot_tokens(slot, "n_prompt_tokens_cache"),
                             _slot_tokens(slot, "n_prompt_tokens"))
        nxt = slot.get("next_token")
        n_past = _slot_tokens(slot, "n_past")
        if n_past is None and isinstance(nxt, dict):
            n_past = _slot_tokens(nxt, "n_past")
        if n_cache is not None and n_prompt:
            if n_cache > n_prompt:
                raise LoadFormatError("/slots 'n_prompt_tokens_cache' above 'n_prompt_tokens'")
            cached, prompt = cached + n_cache, prompt + n_prompt
        tokens = n_prompt if n_prompt is not None else n_past
        if tokens is not None:
            held = tokens if held is None else max(held, tokens)
    if not prompt and held is None:
        return None
    return CachePrior(cached / prompt if prompt else None, held)


def _busy_slots(slots: Any) -> tuple[int, int]:
    """(busy, total) from a /slots document: `is_processing`, or the older `state` == 1."""
    if not isinstance(slots, list) or not all(isinstance(s, dict) for s in slots):
        raise LoadFormatError("/slots is not a list of slot objects")
    busy = sum(1 for s in slots if s.get("is_processing") is True or s.get("state") == 1)
    return busy, len(slots)


def parse_slots(text: str) -> Any:
    """The /slots JSON document (LoadFormatError if it is not JSON)."""
    try:
        return json.loads(text)
    except ValueError:
        raise LoadFormatError("/slots is not JSON") from None


def server_base(url: str) -> str:
    """The server's root URL from the node's OpenAI base URL (a trailing /v1 dropped)."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


class LoadReader:
    """Polls a server's metrics and keeps the latest load; `announcement()` gives what the
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
        self._tps = default_tps
        self._before: Metrics | None = None
        # the server's own key (--api-key-env): llama.cpp guards /metrics and /slots with it
        self._headers = {} if api_key is None else {"Authorization": f"Bearer {api_key}"}
        self.rejected = 0  # pages whose cache fields or slot count were malformed

    def announcement(self) -> tuple[int, float]:
        """(queue, tokens/s) to announce now."""
        latest = self.latest
        return (0 if latest is None else latest.waiting), self._tps

    def take(self, metrics: Metrics | None, slots: Any = None) -> ServerLoad | None:
        """Fold one read (a parsed /metrics page and/or /slots document) into the state."""
        source = self.source
        if source == "auto":
            source = (detect(metrics) if metrics is not None else None) or (
                "llamacpp" if slots is not None else "auto")
            if source == "auto":
                return None
            log.info("load: %s looks like %s", self.base, source)
            self.source = source
        if source == "llamacpp":
            load = llamacpp_load(metrics, slots, self._before)
        elif metrics is None:
            return None
        else:
            load = (vllm_load if source == "vllm" else tgi_load)(metrics, self._before)
        load = replace(load, cache=self._cache(source, metrics, slots),
                       slots=self._slot_count(load.slots))
        if metrics is not None:
            self._before = metrics
        if load.tokens_per_s is not None:
            self._tps = load.tokens_per_s
        self.latest = load
        return load

    def cache_prior(self) -> CachePrior | None:
        """The server's prefix-cache report to announce now (None: it exports none)."""
        latest = self.latest
        return None if latest is None else latest.cache

    def slot_count(self) -> int | None:
        """The server's slot count to announce now (None: it gives none)."""
        latest = self.latest
        return None if latest is None else latest.slots

    def _slot_count(self, count: int | None) -> int | None:
        """A page's slot count, bounded; one out of range is dropped, counted and logged."""
        if count is None:
            return None
        try:
            return slot_count(count, "the /slots count")
        except InvalidNodeError as exc:
            self.rejected += 1
            log.warning("load: %s: slot count refused: %s", self.base, exc)
            return None

    def _cache(self, source: str, metrics: Metrics | None, slots: Any) -> CachePrior | None:
        """The pages' cache prior; a malformed one is dropped, counted and logged."""
        try:
            return server_cache(source, metrics, slots, self._before)
        except LoadFormatError as exc:
            self.rejected += 1
            log.warning("load: %s: cache state refused: %s", self.base, exc)
            return None

    async def read_once(self, session: aiohttp.ClientSession) -> ServerLoad | None:
        """GET the pages this source exports and fold them in; None if nothing usable."""
        metrics = slots = None
        text = await self._get(session, "/metrics")
        if text is not None:
            try:
                metrics = parse_prometheus(text)
            except LoadFormatError as exc:
                log.warning("load: %s/metrics: %s", self.base, exc)
        # /slots: llama.cpp's busy slots (without --metrics) and its cache state (always)
        detected = detect(metrics) if metrics is not None else None
        if self.source in ("auto", "llamacpp") and detected in (None, "llamacpp"):
            page = await self._get(session, "/slots")
            if page is not None:
                try:
                    slots = parse_slots(page)
                    _busy_slots(slots)
                except LoadFormatError as exc:
                    log.warning("load: %s/slots: %s", self.base, exc)
                    slots = None
        return self.take(metrics, slots)

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
