"""The middleware's own options, and the Routers it builds when it is given none."""

from __future__ import annotations

import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Literal

from meshroute_middleware.chat.attempts import DEFAULT_REQUEST_TIMEOUT_S
from meshroute_middleware.core import Router, RouterConfig
from meshroute_middleware.core.clients import Client
from meshroute_middleware.http.request import CHAT_PATH, DEFAULT_BODY_TIMEOUT_S
from meshroute_middleware.http.shape import BodyLimits

MIB = 1024 * 1024
DEFAULT_MAX_BODY_BYTES = 16 * MIB  # the one home of this default (settings refer to it)
ServingMode = Literal["forward", "annotate"]


@dataclass(frozen=True, slots=True)
class MiddlewareConfig:
    """The middleware's own options. The Router and the forwarder are components of their own,
    configured where they are built (`build_router`, `AiohttpForwarder`)."""

    mode: ServingMode = "forward"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    path: str = CHAT_PATH
    forward_headers: tuple[str, ...] = ()  # credentials a node may see (docs/security.md)
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S  # a chat request's total deadline
    body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S  # the whole request body, else 408
    # this gateway's `via` entry (chat/headers.py: a request that comes back with it gets
    # 508); empty: a random one per middleware. Gateways that share a port (--workers)
    # share one, so that a loop through any of them is caught.
    loop_marker: str = ""
    # who may spend (issue 24): with any client, every inference request needs its key
    clients: tuple[Client, ...] = field(default=(), repr=False)
    # the shape a body may have, judged before it is read (http/shape.py: issue 32)
    body_limits: BodyLimits = field(default_factory=BodyLimits)

    def __post_init__(self) -> None:
        if self.mode not in ("forward", "annotate"):
            raise ValueError(f"mode must be 'forward' or 'annotate', got {self.mode!r}")
        if self.max_body_bytes <= 0:
            raise ValueError("max_body_bytes must be positive")
        if not (self.request_timeout_s > 0 and self.body_timeout_s > 0):
            raise ValueError("request_timeout_s and body_timeout_s must be positive")
        if not re.fullmatch(r"[A-Za-z0-9._-]{0,64}", self.loop_marker):
            raise ValueError(f"loop_marker must be a token of letters and digits, got "
                             f"{self.loop_marker!r}")


def build_router(config: RouterConfig | None = None, *, seed: int | None = None,
                 origin: str = "local", clock: Callable[[], float] = time.time) -> Router:
    """A Router with its own rng (seeded for reproducible runs), on the wall clock unless
    told otherwise."""
    return Router(config, clock=clock, rng=random.Random(seed), origin=origin)


def build_embeddings_router(router: Router, *, seed: int | None = None) -> Router:
    """The Router of embeddings requests: `router`'s topology (the same nodes, always), its
    own statistics and policy, so that inputs/s never mix with chat's tokens/s; one input is
    a sample (docs/architecture.md)."""
    return Router(replace(router.config, min_sample_tokens=1), clock=router.clock,
                  rng=random.Random(seed), origin=router.stats.origin,
                  topology=router.topology)
