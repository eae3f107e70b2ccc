"""A real server's own prefix-cache state as a prior for the router's warm prefixes (issue 26).

A node fronting a server that exports its cache state announces two optional fields
(node_agent/load.py reads them):

- `cache_hit`: the share of prompt tokens the server found in its prefix cache lately, in
  [0, 1]: from its counters over a window of at least 512 queried prompt tokens that found
  some (vLLM Δ`vllm:prefix_cache_hits` / Δ`vllm:prefix_cache_queries`; llama.cpp
  Δ`prompt_tokens_cached_total` over that plus Δ`prompt_tokens_total`), or its own gauge
  (SGLang `sglang:cache_hit_rate`, vLLM V0 `vllm:gpu_prefix_cache_hit_rate`) when above 0;
  0 only where the server says its prefix caching is off (vLLM `cache_config_info`). A
  window of new prompts that found nothing says nothing of caching and is not announced;
- `cache_tokens`: the most tokens one of its slots holds, its context (llama.cpp `/props`
  `n_ctx`): a prefix longer than that is not all kept. A slot's last prompt (llama.cpp
  `/slots` `n_prompt_tokens`) is not a capacity and is not announced.

The router knows which routes served which prefixes (core/prefix.py) and takes every served
prefix as warm. The prior bounds that belief while the route has few measured samples: a
server whose slots hold 2,000 tokens is not credited with 5,000 (`prior_warm_tokens`). The
hit rate does not shrink it: a share of the server's recent prompts says nothing of one
prefix it was seen to serve (issue 31: after the always cold first turns two llama-servers
reported ~0, the returning turns' warm prefixes were discounted and they were sent cold to
the other server). It is kept in the node's record (GET /v1/nodes), not weighed. A route
with no prior, or whose hops report nothing, is left exactly as the router sees it.

Both fields come from another process (TXT record, registration): `parse_cache_prior`
bounds them and raises InvalidNodeError, so a bad value rejects the record like any field.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final, NamedTuple

from .errors import InvalidNodeError

HIT_KEY: Final = "cache_hit"
TOKENS_KEY: Final = "cache_tokens"
# The largest context a server's slot may claim: far above any model's context today (1M).
MAX_CACHE_TOKENS: Final = 16_777_216
# The prior's weight in samples' worth: after this many of the route's own measured samples
# the learned belief weighs as much as the server's report; after 10x, ten times as much.
PRIOR_SAMPLES: Final = 4.0


class CachePrior(NamedTuple):
    """What a server says of its prefix cache; None where it says nothing."""

    hit_rate: float | None = None
    cached_tokens: int | None = None


def _field(data: Mapping[str, Any], key: str) -> float | None:
    value = data.get(key)
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise InvalidNodeError(f"'{key}' must be a number, not a boolean")
    if isinstance(value, str):
        text = value.strip()
        if not text.isascii() or len(text) > 32:
            raise InvalidNodeError(f"'{key}' must be a number, got {text[:32]!r}")
        try:
            value = float(text)
        except ValueError:
            raise InvalidNodeError(f"'{key}' must be a number, got {text[:32]!r}") from None
    if isinstance(value, int) and not -MAX_CACHE_TOKENS <= value <= MAX_CACHE_TOKENS:
        raise InvalidNodeError(f"'{key}' is out of range")  # no float of 10**400 either
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidNodeError(f"'{key}' must be a finite number, got {str(value)[:32]!r}")
    return float(value)


def parse_cache_prior(data: Mapping[str, Any]) -> CachePrior | None:
    """The record's `cache_hit` / `cache_tokens`, bounded; None when it has neither."""
    hit, tokens = _field(data, HIT_KEY), _field(data, TOKENS_KEY)
    if hit is None and tokens is None:
        return None
    if hit is not None and not 0.0 <= hit <= 1.0:
        raise InvalidNodeError(f"'{HIT_KEY}' must be in [0, 1], got {hit:g}")
    if tokens is not None and (not tokens.is_integer() or not 0 <= tokens <= MAX_CACHE_TOKENS):
        raise InvalidNodeError(
            f"'{TOKENS_KEY}' must be an integer in 0..{MAX_CACHE_TOKENS}, got {tokens:g}")
    return CachePrior(hit, None if tokens is None else int(tokens))


def prior_fields(prior: CachePrior | None) -> dict[str, float | int]:
    """The prior as record fields (what parse_cache_prior reads back); {} for none."""
    if prior is None:
        return {}
    out: dict[str, float | int] = {}
    if prior.hit_rate is not None:
        out[HIT_KEY] = round(prior.hit_rate, 4)
    if prior.cached_tokens is not None:
        out[TOKENS_KEY] = prior.cached_tokens
    return out


def route_prior(priors: Iterable[CachePrior | None]) -> CachePrior | None:
    """A chain's prior from its hops': a prefix is warm on a chain only where every hop
    holds it, so the lowest hit rate and the fewest tokens of the hops that report."""
    told = [p for p in priors if p is not None]
    hits = [p.hit_rate for p in told if p.hit_rate is not None]
    tokens = [p.cached_tokens for p in told if p.cached_tokens is not None]
    if not hits and not tokens:
        return None
    return CachePrior(min(hits) if hits else None, min(tokens) if tokens else None)


def prior_warm_tokens(prior: CachePrior | None, known_warm: int, samples: float) -> int:
    """The warm tokens to credit a route with: `known_warm` (what the router saw it serve),
    bounded by what one of the server's slots holds, the bound's weight fading as the
    route's own `samples` grow. A hit rate does not shrink it (issue 31): it is a share of
    the server's recent prompts, not a statement about this prefix; after a conversation's
    cold first turn it is near 0 exactly when that turn's prefix is warm."""
    if prior is None or known_warm <= 0 or prior.cached_tokens is None:
        return known_warm
    held = min(float(known_warm), float(prior.cached_tokens))
    weight = PRIOR_SAMPLES / (PRIOR_SAMPLES + max(samples, 0.0))
    return round(weight * held + (1.0 - weight) * known_warm)
