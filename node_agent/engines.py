"""What an inference engine's own pages say, read into one `EngineReading` (pure: text in).

What each engine is read for (docs/architecture.md, "What a node agent reads"):

- llama.cpp's server: `/metrics` (with `--metrics`) `llamacpp:requests_processing`,
  `llamacpp:requests_deferred`, the decode counters `llamacpp:tokens_predicted_total` /
  `llamacpp:tokens_predicted_seconds_total` and the prompt counters
  `llamacpp:prompt_tokens_cached_total` (tokens reused from the cache) /
  `llamacpp:prompt_tokens_total` (tokens processed, the cached ones excluded); `/props`
  `total_slots` and `default_generation_settings.n_ctx` (the context one slot holds);
  `/slots` (read only where those do not say it) the busy slots (`is_processing`, or the
  older `state` 1) and, where `/props` is not there, the slot count and each slot's `n_ctx`.
  `/slots`' per-slot prompt figures (`n_prompt_tokens`, `n_prompt_tokens_cache`, `n_past`)
  describe that slot's last prompt only: neither a cache capacity nor a hit rate, they are
  not read;
- vLLM `/metrics`: `vllm:num_requests_running`, `vllm:num_requests_waiting`,
  `vllm:kv_cache_usage_perc` (the older `vllm:gpu_cache_usage_perc`), the prefix-cache
  counters `vllm:prefix_cache_queries` / `vllm:prefix_cache_hits` (and the older
  `vllm:gpu_prefix_cache_*`, or V0's gauge `vllm:gpu_prefix_cache_hit_rate`),
  `vllm:cache_config_info`'s `enable_prefix_caching` label, and the decode histogram
  `vllm:inter_token_latency_seconds` (the older `vllm:time_per_output_token_seconds`);
- SGLang `/metrics` (`--enable-metrics`): `sglang:num_running_reqs`, `sglang:num_queue_reqs`
  (with priority scheduling their priority="" series, the total), `sglang:token_usage`, the
  prefill counters `sglang:prefill_effective_tokens_total` by `mode` (hits and input tokens;
  where not exported, the gauge `sglang:cache_hit_rate`, the last prefill batch's rate),
  `sglang:max_running_requests` where exported, and the decode histogram
  `sglang:inter_token_latency_seconds` (the older `sglang:time_per_output_token_seconds`);
- TGI `/metrics`: `tgi_queue_size`, `tgi_batch_current_size`, and
  `tgi_request_mean_time_per_token_duration` (a histogram of each request's mean).

A reading holds counters, not rates: node_agent/windows.py makes figures of them.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from meshroute_middleware.core.cache_prior import MAX_CACHE_TOKENS
from meshroute_middleware.core.errors import MeshRouteError

from .windows import Counters

SOURCES = ("vllm", "llamacpp", "sglang", "tgi")
Metrics = dict[str, float]  # metric name -> value summed over its label sets
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"')


class LoadFormatError(MeshRouteError, ValueError):
    """A page that is not the metrics, slots or props document it claims to be."""


# Labels whose values split one metric into parts the readers tell apart: SGLang's
# `mode` (its prefill counters' input and hit tokens) and `priority` (with priority
# scheduling its request gauges carry the total under priority="" beside each priority's).
SPLIT_LABELS = ("mode", "priority")


class MetricsPage(NamedTuple):
    """A Prometheus page: values summed over label sets (a server's requests are the sum of
    its engines'), averaged (a fraction such as a cache usage is not summed), the first
    label set of each name (an info metric's labels), and the sums by (name, label, value)
    of the SPLIT_LABELS."""

    sums: Metrics
    means: Metrics
    labels: dict[str, dict[str, str]]
    parts: dict[tuple[str, str, str], float]


@dataclass(frozen=True, slots=True)
class EngineReading:
    """One read of an engine: its load now, and the counters the windows difference."""

    source: str
    running: int
    waiting: int
    slots: int | None = None  # requests it runs at once, where it says
    decode: Counters | None = None  # (generated tokens, seconds generating them)
    cache: Counters | None = None  # (prompt tokens found cached, prompt tokens queried)
    cache_hit_gauge: float | None = None  # the engine's own recent hit rate, in (0, 1]
    caching_off: bool = False  # the engine says its prefix caching is disabled
    context_tokens: int | None = None  # the most tokens one slot holds (its context)
    kv_cache_usage: float | None = None  # the share of the KV cache in use now
    decode_min_tokens: float | None = field(default=None, compare=False)  # TGI: requests
    refused: tuple[str, ...] = field(default=(), compare=False)  # fields malformed, dropped


def read_metrics(text: str) -> MetricsPage:
    """Prometheus text exposition -> MetricsPage (histograms keep their `_sum` / `_count` /
    `_bucket` names); LoadFormatError for a line that is not a sample."""
    sums: Metrics = {}
    counts: dict[str, int] = {}
    labels: dict[str, dict[str, str]] = {}
    parts: dict[tuple[str, str, str], float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        label_text = ""
        if "{" in line:
            name, rest = line.split("{", 1)
            close = rest.rfind("}")
            if close < 0:
                raise LoadFormatError(f"unclosed label set: {line[:80]!r}")
            label_text, fields = rest[:close], rest[close + 1:].split()
        else:
            name, *fields = line.split()
        if not fields:
            raise LoadFormatError(f"sample without a value: {line[:80]!r}")
        try:
            value = float(fields[0])
        except ValueError:
            raise LoadFormatError(f"bad sample value: {line[:80]!r}") from None
        name = name.strip()
        sums[name] = sums.get(name, 0.0) + value
        counts[name] = counts.get(name, 0) + 1
        if name not in labels:
            labels[name] = dict(_LABEL.findall(label_text))
        if any(f'{label}="' in label_text for label in SPLIT_LABELS):
            found = dict(_LABEL.findall(label_text))
            for label in SPLIT_LABELS:
                if label in found:
                    key = (name, label, found[label])
                    parts[key] = parts.get(key, 0.0) + value
    means = {name: total / counts[name] for name, total in sums.items()}
    return MetricsPage(sums, means, labels, parts)


def parse_prometheus(text: str) -> Metrics:
    """Prometheus text -> {name: value summed over label sets}."""
    return read_metrics(text).sums


def detect(metrics: Mapping[str, float]) -> str | None:
    """Which engine exported these metrics: "vllm", "llamacpp", "sglang", "tgi" or None."""
    for prefix, source in (("vllm:", "vllm"), ("llamacpp:", "llamacpp"),
                           ("sglang:", "sglang"), ("tgi_", "tgi")):
        if any(name.startswith(prefix) for name in metrics):
            return source
    return None


def _count(metrics: Mapping[str, float], name: str) -> int:
    value = metrics.get(name, 0.0)
    return int(value) if math.isfinite(value) and value > 0 else 0


def _pair(metrics: Mapping[str, float], part: str, whole: str) -> Counters | None:
    a, b = metrics.get(part), metrics.get(whole)
    return None if a is None or b is None else Counters(a, b)


def _histogram(metrics: Mapping[str, float], *names: str) -> Counters | None:
    """(observations, seconds) of the first of these histograms the page has."""
    for name in names:
        found = _pair(metrics, name + "_count", name + "_sum")
        if found is not None:
            return found
    return None


def _fraction(means: Mapping[str, float], refused: list[str], *names: str) -> float | None:
    """The first of these gauges present, as a share in [0, 1]; one that is not a share is
    dropped and noted in `refused`."""
    for name in names:
        value = means.get(name)
        if value is not None:
            if not (math.isfinite(value) and 0.0 <= value <= 1.0):
                refused.append(f"{name} {value:g} is not a share in [0, 1]")
                return None
            return value
    return None


def _positive(value: float | None) -> float | None:
    return value if value is not None and value > 0 else None


# vLLM's prefix-cache counters (prompt tokens) by version: the prometheus client exports a
# counter `x` as `x_total`; V1's are `vllm:prefix_cache_*`, releases up to 0.10 also had the
# deprecated `vllm:gpu_prefix_cache_*`. V0 exported a gauge `vllm:gpu_prefix_cache_hit_rate`.
VLLM_CACHE_COUNTERS = (("vllm:prefix_cache_hits_total", "vllm:prefix_cache_queries_total"),
                       ("vllm:prefix_cache_hits", "vllm:prefix_cache_queries"),
                       ("vllm:gpu_prefix_cache_hits_total", "vllm:gpu_prefix_cache_queries_total"),
                       ("vllm:gpu_prefix_cache_hits", "vllm:gpu_prefix_cache_queries"))
VLLM_HIT_RATE_GAUGE = "vllm:gpu_prefix_cache_hit_rate"


def vllm_reading(page: MetricsPage) -> EngineReading:
    """vLLM's /metrics."""
    m = page.sums
    cache = next((found for hits, queries in VLLM_CACHE_COUNTERS
                  if (found := _pair(m, hits, queries)) is not None), None)
    info = page.labels.get("vllm:cache_config_info", {})
    refused: list[str] = []
    return EngineReading(
        "vllm", _count(m, "vllm:num_requests_running"), _count(m, "vllm:num_requests_waiting"),
        decode=_histogram(m, "vllm:inter_token_latency_seconds",
                          "vllm:time_per_output_token_seconds"),
        cache=cache,
        cache_hit_gauge=None if cache else _positive(
            _fraction(page.means, refused, VLLM_HIT_RATE_GAUGE)),
        caching_off=info.get("enable_prefix_caching", "").lower() == "false",
        kv_cache_usage=_fraction(page.means, refused, "vllm:kv_cache_usage_perc",
                                 "vllm:gpu_cache_usage_perc"),
        refused=tuple(refused))


# SGLang's prefill counters (prompt tokens, by `mode`: "input" computed, "device_hit",
# "host_hit", "storage_hit" found cached), pre-seeded at 0 for every mode; its docs give the
# windowed hit rate as the hits' rate over all modes' (sglang 0.5.23,
# srt/observability/metrics_collector.py). Its gauge `sglang:cache_hit_rate` is the last
# prefill batch's rate only: read where the counters are not exported (older releases).
SGLANG_PREFILL_COUNTER = "sglang:prefill_effective_tokens_total"


def _requests(page: MetricsPage, name: str) -> int:
    """A request gauge's total: with priority scheduling SGLang exports it under
    priority="" beside each priority's share, which summing would count twice."""
    total = page.parts.get((name, "priority", ""))
    return _count({name: total} if total is not None else page.sums, name)


def _sglang_cache(page: MetricsPage) -> Counters | None:
    """(hit, queried) prompt tokens from SGLang's prefill counters; None if not exported."""
    modes = {value: count for (name, label, value), count in page.parts.items()
             if name == SGLANG_PREFILL_COUNTER and label == "mode"}
    if "input" not in modes:
        return None
    hits = sum(count for mode, count in modes.items() if mode.endswith("_hit"))
    return Counters(hits, hits + modes["input"])


def sglang_reading(page: MetricsPage) -> EngineReading:
    """SGLang's /metrics."""
    m = page.sums
    slots = m.get("sglang:max_running_requests")
    cache = _sglang_cache(page)
    refused: list[str] = []
    return EngineReading(
        "sglang", _requests(page, "sglang:num_running_reqs"),
        _requests(page, "sglang:num_queue_reqs"),
        slots=None if slots is None else int(page.means["sglang:max_running_requests"]),
        decode=_histogram(m, "sglang:inter_token_latency_seconds",
                          "sglang:time_per_output_token_seconds"),
        cache=cache,
        cache_hit_gauge=None if cache is not None else _positive(
            _fraction(page.means, refused, "sglang:cache_hit_rate")),
        kv_cache_usage=_fraction(page.means, refused, "sglang:token_usage"),
        refused=tuple(refused))


def tgi_reading(page: MetricsPage) -> EngineReading:
    """TGI's /metrics: its speed histogram observes one mean per request, so its window
    counts requests, not tokens."""
    m = page.sums
    return EngineReading("tgi", _count(m, "tgi_batch_current_size"), _count(m, "tgi_queue_size"),
                         decode=_histogram(m, "tgi_request_mean_time_per_token_duration"),
                         decode_min_tokens=1.0)


def llamacpp_reading(page: MetricsPage | None, slots: Any = None,
                     props: Any = None) -> EngineReading:
    """llama.cpp's server from /metrics, /slots and /props (any may be missing)."""
    running, slot_count, context = 0, None, None
    refused: list[str] = []
    if slots is not None:
        running, slot_count = busy_slots(slots)
    if props is not None:
        slot_count = props_slots(props, slot_count)
    try:
        context = _slots_context(slots) if slots is not None else None
        context = context if props is None else props_context(props, context)
    except LoadFormatError as exc:
        refused.append(str(exc))
        context = None
    if page is None:
        return EngineReading("llamacpp", running, 0, slot_count, context_tokens=context,
                             refused=tuple(refused))
    m = page.sums
    if "llamacpp:requests_processing" in m:
        running = _count(m, "llamacpp:requests_processing")
    cached, processed = (m.get("llamacpp:prompt_tokens_cached_total"),
                         m.get("llamacpp:prompt_tokens_total"))
    return EngineReading(
        "llamacpp", running, _count(m, "llamacpp:requests_deferred"), slot_count,
        decode=_pair(m, "llamacpp:tokens_predicted_total",
                     "llamacpp:tokens_predicted_seconds_total"),
        cache=None if cached is None or processed is None else Counters(cached,
                                                                        cached + processed),
        context_tokens=context, refused=tuple(refused))


def busy_slots(slots: Any) -> tuple[int, int]:
    """(busy, total) from a /slots document: `is_processing`, or the older `state` == 1."""
    if not isinstance(slots, list) or not all(isinstance(s, dict) for s in slots):
        raise LoadFormatError("/slots is not a list of slot objects")
    busy = sum(1 for s in slots if s.get("is_processing") is True or s.get("state") == 1)
    return busy, len(slots)


def _tokens(value: Any, what: str) -> int | None:
    """A token count, bounded; None if absent; LoadFormatError if not a count."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) \
            or not 0 < value <= MAX_CACHE_TOKENS:
        raise LoadFormatError(f"{what} is not a token count: {str(value)[:32]!r}")
    return value


def _slots_context(slots: list[dict[str, Any]]) -> int | None:
    """The largest `n_ctx` of the slots (each slot's context), None if they give none."""
    found = [n for s in slots if (n := _tokens(s.get("n_ctx"), "/slots 'n_ctx'")) is not None]
    return max(found) if found else None


def props_context(props: Any, default: int | None = None) -> int | None:
    """/props' `default_generation_settings.n_ctx`: the context of one slot."""
    if not isinstance(props, dict):
        raise LoadFormatError("/props is not an object")
    settings = props.get("default_generation_settings")
    if not isinstance(settings, dict):
        return default
    found = _tokens(settings.get("n_ctx"), "/props 'n_ctx'")
    return default if found is None else found


def slots_needed(page: MetricsPage | None, props: Any) -> bool:
    """Whether llama.cpp's /slots says anything /metrics and /props do not: it does when
    /metrics lacks `requests_processing` (no `--metrics`) or /props its slot count or context.
    Each read of a page is a task on the server's one loop, between its batches: the agent
    reads the fewest."""
    if page is None or "llamacpp:requests_processing" not in page.sums or props is None:
        return True
    try:
        return props_slots(props) is None or props_context(props) is None
    except LoadFormatError:
        return True


def props_slots(props: Any, default: int | None = None) -> int | None:
    """/props' `total_slots` (a raw count: core/slot_count.py bounds it)."""
    if not isinstance(props, dict):
        raise LoadFormatError("/props is not an object")
    total = props.get("total_slots")
    if isinstance(total, bool) or not isinstance(total, int):
        return default
    return total


def parse_json(text: str, what: str) -> Any:
    """A JSON page (/slots, /props); LoadFormatError if it is not JSON."""
    try:
        return json.loads(text)
    except ValueError:
        raise LoadFormatError(f"{what} is not JSON") from None


def parse_slots(text: str) -> Any:
    """The /slots JSON document (LoadFormatError if it is not JSON)."""
    return parse_json(text, "/slots")
