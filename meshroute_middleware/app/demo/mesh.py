"""The demo's mesh: which emulated nodes exist, and each node's life as a task of its own.

A node lives in one task (its uvicorn server, its mDNS announcement or HTTP registration), so
that leaving is that task's own business: say goodbye, wait until the gateway has dropped the
node, drain what is still running on it, then stop the server.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from meshroute_middleware.core import NodeRecord, parse_node
from node_agent.announcer import NodeAnnouncer
from node_agent.emulator import EmulatedNode, EmulatorConfig, serve_node

QWEN = "qwen-demo"
LLAMA = "llama-demo"
LOOPBACK = "127.0.0.1"  # mDNS stays on this machine: nothing multicasts onto a real network
GONE_WAIT_S = 5.0  # how long a leaving node waits for the gateway to drop it
DRAIN_WAIT_S = 10.0  # and then for the requests still running on it


@dataclass(frozen=True, slots=True)
class DemoNode:
    """One emulated node of the demo mesh; tps is for its own shard."""

    node_id: str
    model: str
    start: int
    end: int
    layers: int
    tps: float
    slots: int = 4  # requests in its batch at once; more wait in its queue
    slot_slowdown: float = 0.0  # each request's slowdown per batch neighbour (0: free)

    def record(self, url: str) -> dict[str, Any]:
        """The node record it announces or registers (its slots too, as `meshroute node
        --emulate` announces them)."""
        return {"node_id": self.node_id, "model": self.model, "start": self.start,
                "end": self.end, "layers": self.layers, "url": url, "tps": self.tps,
                "slots": self.slots}


# ADR-0020's mixed topology: GPU boxes with half the layers, CPU boxes with all of them.
# cpu-b is a single-hop route, so its leaving takes no other route's hop with it.
# Servers behave as real ones do (issue 14): the GPU boxes batch (vLLM-like: a few per cent
# slower per neighbour), the CPU boxes run one request at a time (llama.cpp without
# --parallel), the edge pair batches a little and the laptop is serial; each announces its
# slots (a prior for its route's knee) and the policy learns the rest of each route's curve
# (its slowdown, where it really saturates) from what it measures.
MESH = (
    DemoNode("gpu-a", QWEN, 0, 21, 40, 150.0, slots=6, slot_slowdown=0.05),
    DemoNode("gpu-b", QWEN, 0, 19, 40, 80.0, slots=4, slot_slowdown=0.05),
    DemoNode("cpu-a", QWEN, 0, 39, 40, 30.0, slots=1),
    DemoNode("cpu-b", QWEN, 0, 39, 40, 22.0, slots=1),
    DemoNode("cpu-c", QWEN, 20, 39, 40, 100.0, slots=6, slot_slowdown=0.05),
    # A second model, 32 layers: an edge pair splitting it, a whole-model box, a laptop.
    DemoNode("edge-1", LLAMA, 0, 15, 32, 90.0, slots=4, slot_slowdown=0.15),
    DemoNode("edge-2", LLAMA, 16, 31, 32, 70.0, slots=4, slot_slowdown=0.15),
    DemoNode("box", LLAMA, 0, 31, 32, 35.0, slots=2, slot_slowdown=0.1),
    DemoNode("laptop", LLAMA, 0, 31, 32, 18.0, slots=1),
)
# Every node has a prefix cache (issue 26): the demo's conversations find their prefix warm
# on the node that served the turn before, and cold elsewhere (a few hundred ms of prefill).
PREFILL_TPS = 4000.0  # prompt tokens/s over all of a model's layers
CACHE_TOKENS = 32_000
LEAVER = "cpu-b"
DRIFTER = "gpu-a"
# Joins later: a fast head for the first 24 layers, completed by cpu-c -> the new best route.
JOINER = DemoNode("gpu-c", QWEN, 0, 23, 40, 200.0, slots=6, slot_slowdown=0.05)
MODELS = (QWEN, LLAMA)
CLIENT_SHARE = {QWEN: 0.6, LLAMA: 0.4}  # share of the demo's requests per model


@dataclass(eq=False)
class LiveNode:
    """A running emulated node; `leave()` makes it say goodbye and stop."""

    spec: DemoNode
    seed: int
    node: EmulatedNode | None = None
    url: str = ""
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    _leave: asyncio.Event = field(default_factory=asyncio.Event)
    _drain: bool = True
    task: asyncio.Task[None] | None = None

    def config(self) -> EmulatorConfig:
        """The emulator's configuration of this node."""
        s = self.spec
        return EmulatorConfig(node_id=s.node_id, model=s.model, start=s.start, end=s.end,
                              layers=s.layers, tps=s.tps, slots=s.slots,
                              slot_slowdown=s.slot_slowdown, noise_sigma=0.1,
                              seed=self.seed, hop_latency_s=0.0005,
                              prefill_tps=PREFILL_TPS, cache_tokens=CACHE_TOKENS)

    def start(self, gateway: Any, http: tuple[aiohttp.ClientSession, str] | None) -> None:
        """Run the node in a task of its own: announced over mDNS, or (`http`: the session
        and the gateway's URL) registered with POST /v1/nodes."""
        self.task = asyncio.create_task(self._live(gateway, http), name=self.spec.node_id)

    def leave(self, drain: bool = True) -> None:
        """Say goodbye and stop (after draining, unless the whole demo is stopping)."""
        self._drain = drain
        self._leave.set()

    async def _live(self, gateway: Any,
                    http: tuple[aiohttp.ClientSession, str] | None) -> None:
        async with serve_node(self.config()) as (node, url):
            self.node, self.url = node, url
            if http is None:
                await self._announced(node)
            else:
                await register(*http, self)
                self.ready.set()
                await self._leave.wait()
                if self._drain:
                    await unregister(*http, self.spec.node_id)
            if self._drain:
                await _gone_from(gateway, self.spec.node_id)
                await _drained(node)

    async def _announced(self, node: EmulatedNode) -> None:
        """Announce over mDNS on loopback, keep the load current, goodbye on leaving."""
        record = parse_node(self.spec.record(self.url))
        announcer = NodeAnnouncer(record, interfaces=LOOPBACK)
        await announcer.start()
        follower = asyncio.create_task(announcer.follow(_load_of(node)))
        self.ready.set()
        try:
            await self._leave.wait()
        finally:
            follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follower
            await announcer.close()  # the goodbye packet: the gateway drops the node at once

    def layer_s(self) -> float:
        """Seconds per layer per token as the emulator runs this node now (idle, no noise)."""
        cfg = self.node.worker.config if self.node is not None else self.config()
        return cfg.layer_s

    def slow_down(self, factor: float) -> tuple[float, float]:
        """Make the node `factor` times slower; (tok/s before, after) on its shard."""
        assert self.node is not None
        cfg = self.node.worker.config
        before = 1.0 / (cfg.layer_s * cfg.shard_layers)
        self.node.worker.config = replace(cfg, tps=before / factor)
        return before, before / factor


def _load_of(node: EmulatedNode) -> Any:
    """What a node agent announces as its load: queue depth and measured tokens/s."""
    return lambda: (node.queue_depth, node.measured_tps)


async def _gone_from(gateway: Any, node_id: str) -> None:
    """Wait (bounded) until the gateway's topology no longer holds the node."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + GONE_WAIT_S
    while loop.time() < deadline and _present(gateway, node_id):
        await asyncio.sleep(0.05)


async def _drained(node: EmulatedNode) -> None:
    """Wait (bounded) until no request runs or waits on the node."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DRAIN_WAIT_S
    while loop.time() < deadline and (node.worker.running or node.worker.waiting):
        await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)  # the last response's final bytes


def _present(gateway: Any, node_id: str) -> bool:
    return any(n.node_id == node_id for n in gateway.router.topology.nodes())


def present_nodes(gateway: Any) -> dict[str, NodeRecord]:
    """The gateway's current nodes by id."""
    return {n.node_id: n for n in gateway.router.topology.nodes()}


async def register(session: aiohttp.ClientSession, gw_url: str, live: LiveNode) -> None:
    """Register a node over HTTP (POST /v1/nodes)."""
    async with session.post(gw_url + "/v1/nodes", json=live.spec.record(live.url)) as resp:
        resp.raise_for_status()


async def unregister(session: aiohttp.ClientSession, gw_url: str, node_id: str) -> None:
    """The HTTP goodbye (DELETE /v1/nodes/{id})."""
    async with session.delete(f"{gw_url}/v1/nodes/{node_id}") as resp:
        resp.raise_for_status()


def parse_signature(signature: str) -> list[dict[str, Any]]:
    """The hops of a route signature `model|a[0-21]->b[22-39]` (empty when malformed)."""
    hops = []
    for part in signature.split("|", 1)[-1].split("->"):
        node_id, _, span = part.partition("[")
        first, _, last = span.rstrip("]").partition("-")
        if not (node_id and first.isdigit() and last.isdigit()):
            return []
        hops.append({"node_id": node_id, "start_layer": int(first), "end_layer": int(last)})
    return hops


def route_true_tps(hops: list[dict[str, Any]], nodes: dict[str, LiveNode]) -> float:
    """What the emulator really does on a route: 1 / Σ(layers × seconds per layer)."""
    per_token = 0.0
    for h in hops:
        live = nodes.get(h["node_id"])
        if live is None:
            return 0.0
        per_token += (h["end_layer"] - h["start_layer"] + 1) * live.layer_s()
    return 1.0 / per_token if per_token > 0 else 0.0
