"""An emulated shard's compute: slots with a queue, per-layer time, noise, faults, measurement."""

from __future__ import annotations

import math
import random
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from meshroute_middleware.core.errors import MeshRouteError
from meshroute_middleware.core.prefix import Prefix, PrefixCache, message_key

# EWMA weight of one token's measured seconds-per-layer in the advertised tps.
MEASURE_ALPHA = 0.05


class EmulatorError(MeshRouteError):
    """Base of the emulator's errors; each maps to an OpenAI-style HTTP error."""

    status = 500
    kind = "server_error"


class QueueFullError(EmulatorError):
    """Every slot is busy and the queue is at its limit."""

    status = 503
    kind = "overloaded_error"


class InjectedFault(EmulatorError):
    """A failure the fault knobs asked for."""


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    """Knobs of one emulated shard node (times in seconds, shares in [0, 1])."""

    node_id: str = "emu-0"
    model: str = "emu-model"
    start: int = 0
    end: int = 31
    layers: int = 32
    seconds_per_layer: float = 0.0005  # per generated token: 32 layers -> 62.5 tok/s
    tps: float | None = None  # if set: tokens/s of this node's whole shard, overrides the above
    hop_latency_s: float = 0.0  # per token, charged by a downstream hop for the link into it
    slots: int = 4
    # Continuous batching: with k requests in the batch each token costs (1 + slot_slowdown ·
    # (k − 1)) times its solo time (0: free batching, 1: no gain from batching at all).
    slot_slowdown: float = 0.0
    max_queue: int = 256
    noise_sigma: float = 0.0  # per-request multiplicative log-normal noise on compute time
    seed: int = 0
    fail_share: float = 0.0  # answer 500 before generating
    die_share: float = 0.0  # drop the connection half-way through the tokens
    stall_share: float = 0.0  # sleep stall_s before the first token
    stall_s: float = 30.0
    max_tokens_default: int = 16
    max_tokens_limit: int = 4096
    # Prefix caching (issue 26): prompt tokens/s of the whole model (this node prefills its
    # share of the layers; 0: prompts cost nothing, as before), the cache's capacity in
    # tokens (LRU; 0: none) and a base latency before every first token.
    prefill_tps: float = 0.0
    cache_tokens: int = 0
    first_token_s: float = 0.0
    # /v1/embeddings: the vectors' length (a request's `dimensions` may ask for fewer)
    embedding_dim: int = 64

    def __post_init__(self) -> None:
        if not 0 <= self.start <= self.end < self.layers:
            raise ValueError(f"bad shard {self.start}-{self.end} of {self.layers} layers")
        if self.slots < 1 or self.max_queue < 0:
            raise ValueError("slots must be >= 1 and max_queue >= 0")
        if self.tps is not None and self.tps <= 0:
            raise ValueError("tps must be positive")
        if (self.seconds_per_layer < 0 or self.hop_latency_s < 0 or self.noise_sigma < 0
                or self.slot_slowdown < 0 or self.prefill_tps < 0 or self.cache_tokens < 0
                or self.first_token_s < 0):
            raise ValueError("times and noise must not be negative")
        if not 1 <= self.embedding_dim <= 4096:
            raise ValueError("embedding_dim must be in 1..4096")
        if self.fail_share + self.die_share + self.stall_share > 1:
            raise ValueError("fault shares add up to more than 1")

    @property
    def shard_layers(self) -> int:
        """How many layers this node serves."""
        return self.end - self.start + 1

    @property
    def layer_s(self) -> float:
        """Seconds of compute per layer per generated token."""
        if self.tps is not None:
            return 1.0 / (self.tps * self.shard_layers)
        return self.seconds_per_layer

    @property
    def covers_model(self) -> bool:
        """Whether this node alone serves every layer."""
        return self.start == 0 and self.end == self.layers - 1


class TokenTimer:
    """Sleeps each token's compute time, paying back oversleep on the next token."""

    def __init__(self, worker: ShardWorker, layers: int, noise: float) -> None:
        self._worker, self._layers = worker, layers
        self._cost_s = layers * worker.config.layer_s * noise
        self._debt_s = 0.0

    async def step(self, extra_s: float = 0.0) -> None:
        """One token's work on this hop (plus `extra_s` of link latency)."""
        target_s = self._cost_s * self._worker.slowdown() + extra_s + self._debt_s
        began = time.perf_counter()
        if target_s > 0:
            await anyio.sleep(target_s)
        spent_s = time.perf_counter() - began
        self._debt_s = target_s - spent_s
        self._worker.observe(max(spent_s - extra_s, 0.0), self._layers)


class ShardWorker:
    """The node's serving state: slots, queue, seeded rng, counters and measured speed."""

    def __init__(self, config: EmulatorConfig) -> None:
        self.config = config
        self._rng = random.Random(config.seed)
        self._slots = anyio.Semaphore(config.slots)
        self.waiting = 0
        self.running = 0
        self.tokens_total = 0
        self.requests_total = 0
        self._layer_s_ewma: float | None = None
        self.cache = PrefixCache(config.cache_tokens) if config.cache_tokens > 0 else None
        self.cached_tokens_total = 0  # prompt tokens found in the cache
        self.prefilled_tokens_total = 0  # prompt tokens prefilled

    def prefill_s(self, prompt: Prefix | None, layers: int) -> float:
        """Seconds before this hop's first token: the base latency and the prefill of the
        prompt's tokens not in the cache over `layers` of the model's layers; the prompt
        (its KV state) is cached from then on."""
        cfg = self.config
        if prompt is None or cfg.prefill_tps <= 0:
            return cfg.first_token_s
        cached = self.cache.match(prompt) if self.cache is not None else 0
        uncached = prompt.prompt_tokens - cached
        self.cached_tokens_total += cached
        self.prefilled_tokens_total += uncached
        if self.cache is not None:
            self.cache.store(prompt)
        return cfg.first_token_s + uncached * layers / cfg.layers / cfg.prefill_tps

    def cached_tokens(self, prompt: Prefix | None) -> int:
        """The prompt's tokens this hop holds now (no LRU touch; prefill_s does that)."""
        if prompt is None or self.cache is None:
            return 0
        return self.cache.match(prompt, touch=False)

    def remember(self, prompt: Prefix | None, answer: str) -> None:
        """Cache the prompt with its answer: the next turn of the conversation repeats it."""
        if prompt is not None and self.cache is not None:
            self.cache.store(prompt.extended(*message_key("assistant", answer)))

    @property
    def queue_depth(self) -> int:
        """Requests waiting for a slot."""
        return self.waiting

    @property
    def held(self) -> int:
        """Requests it holds: running and waiting for a slot."""
        return self.running + self.waiting

    @property
    def measured_tps(self) -> float:
        """Tokens/s of this node's whole shard, from measured compute (configured before)."""
        layer_s = self.config.layer_s if self._layer_s_ewma is None else self._layer_s_ewma
        return 1.0 / max(layer_s * self.config.shard_layers, 1e-9)

    def observe(self, spent_s: float, layers: int) -> None:
        """Record one token's compute over `layers` layers."""
        self.tokens_total += 1
        if layers <= 0:
            return
        sample = spent_s / layers
        old = self._layer_s_ewma
        self._layer_s_ewma = sample if old is None else old + MEASURE_ALPHA * (sample - old)

    def slowdown(self) -> float:
        """Per-token compute multiplier for the batch running now (`slot_slowdown`)."""
        return 1.0 + self.config.slot_slowdown * max(self.running - 1, 0)

    def noise(self) -> float:
        """A mean-1 log-normal factor for one request's compute time."""
        sigma = self.config.noise_sigma
        return 1.0 if sigma == 0 else math.exp(self._rng.gauss(-sigma * sigma / 2, sigma))

    def fault(self) -> str | None:
        """Which injected fault this request suffers: 'fail', 'die', 'stall' or None."""
        cfg = self.config
        if cfg.fail_share + cfg.die_share + cfg.stall_share == 0:
            return None
        draw = self._rng.random()
        for name, share in (("fail", cfg.fail_share), ("die", cfg.die_share),
                            ("stall", cfg.stall_share)):
            if draw < share:
                return name
            draw -= share
        return None

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the node's slots, queueing for it; QueueFullError past max_queue."""
        if self.running >= self.config.slots and self.waiting >= self.config.max_queue:
            raise QueueFullError(f"node {self.config.node_id}: all {self.config.slots} slots "
                                 f"busy and {self.waiting} requests queued")
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1
        self.running += 1
        self.requests_total += 1
        try:
            yield
        finally:
            self.running -= 1
            self._slots.release()
