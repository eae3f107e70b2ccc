"""Shared helpers for gossip tests: routers with the same two-route mesh."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace

import anyio

from gossip.service import GossipService
from meshroute_middleware.core.config import RouterConfig
from meshroute_middleware.core.policies import Outcome
from meshroute_middleware.core.router import Router
from meshroute_middleware.core.topology import NodeRecord

MODEL = "m"
NODES = (NodeRecord("fast", MODEL, 0, 9, 10, "http://127.0.0.1:9/a", tps=10.0),
         NodeRecord("slow", MODEL, 0, 9, 10, "http://127.0.0.1:9/b", tps=20.0))


def make_router(origin: str, clock: Callable[[], float], explore_share: float = 0.0,
                policy: str | None = None) -> Router:
    """A router knowing both nodes (joined at the clock's current time); the default policy
    unless `policy` names another."""
    config = RouterConfig(explore_share=explore_share)
    router = Router(replace(config, policy=policy) if policy else config, clock=clock,
                    rng=random.Random(1), origin=origin)
    for node in NODES:
        router.upsert_node(node)
    return router


def record(router: Router, node_id: str, tps: float, n: int = 1) -> None:
    """Record n samples of `tps` tokens/s on the one-hop route headed by `node_id`."""
    for _ in range(n):
        decision = router.choose(MODEL, pin=[node_id])
        router.record(decision, Outcome(completion_tokens=int(tps), seconds=1.0, ttfb_s=0.1))


def learned(router: Router) -> dict[str, float | None]:
    """Per head, the learned tps in the routing table."""
    table = router.routing_table(MODEL)["models"][MODEL]["candidates"]
    return {row["head"]: row["tps"] for row in table}


def shares(router: Router) -> dict[str, float]:
    """Per head, the expected traffic share."""
    table = router.routing_table(MODEL)["models"][MODEL]["candidates"]
    return {row["head"]: row["share"] for row in table}


def close(a: float | None, b: float | None, rel: float = 0.01) -> bool:
    """Whether two learned tps agree within `rel` (None only matches None)."""
    if a is None or b is None:
        return a is b
    return abs(a - b) <= rel * max(abs(a), abs(b))


async def run_round(service: GossipService) -> None:
    """One gossip round, awaited (the service's own loop does not wait for its exchanges)."""
    async with anyio.create_task_group() as tg:
        for peer in service.pick():
            tg.start_soon(service.exchange, peer)
