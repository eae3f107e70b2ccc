"""A live gateway with emulated nodes of two models and chat traffic, all on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from meshroute_middleware.app.gateway import Gateway, build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig
from node_agent.emulator import EmulatedNode, EmulatorConfig, serve_node
from node_agent.serving import serve_app


@dataclass(frozen=True, slots=True)
class Shard:
    """An emulated node: layers start..end of a model with `layers` layers, tok/s of its shard."""

    node_id: str
    model: str
    start: int
    end: int
    layers: int
    tps: float

    def record(self, url: str) -> dict[str, Any]:
        return {"node_id": self.node_id, "model": self.model, "start": self.start,
                "end": self.end, "layers": self.layers, "url": url, "tps": self.tps}


# The demo's ADR-0020 mixed topology, and a second model split across two boxes.
QWEN = (Shard("gpu-a", "qwen-demo", 0, 21, 40, 150.0),
        Shard("gpu-b", "qwen-demo", 0, 19, 40, 80.0),
        Shard("cpu-a", "qwen-demo", 0, 39, 40, 30.0),
        Shard("cpu-c", "qwen-demo", 20, 39, 40, 100.0))
LLAMA = (Shard("edge-1", "llama-8b", 0, 15, 32, 90.0),
         Shard("edge-2", "llama-8b", 16, 31, 32, 70.0),
         Shard("mini", "llama-8b", 0, 31, 32, 35.0))


@dataclass
class LiveMesh:
    """The running pieces: the gateway, its URL, and the node URLs by id."""

    gateway: Gateway
    url: str
    session: aiohttp.ClientSession
    stack: contextlib.AsyncExitStack
    node_urls: dict[str, str] = field(default_factory=dict)
    nodes: dict[str, EmulatedNode] = field(default_factory=dict)
    ok: int = 0
    failed: int = 0

    async def start_node(self, shard: Shard, seed: int = 0) -> str:
        """Serve an emulated node (it stays up until the mesh closes); its URL."""
        config = EmulatorConfig(node_id=shard.node_id, model=shard.model, start=shard.start,
                                end=shard.end, layers=shard.layers, tps=shard.tps, slots=6,
                                noise_sigma=0.1, seed=seed, hop_latency_s=0.0005)
        node, url = await self.stack.enter_async_context(serve_node(config))
        self.nodes[shard.node_id], self.node_urls[shard.node_id] = node, url
        return url

    def slow_down(self, node_id: str, factor: float) -> None:
        """The node computes `factor` times slower from now on (drift, as in the demo)."""
        worker = self.nodes[node_id].worker
        worker.config = replace(worker.config, tps=None,
                                seconds_per_layer=worker.config.layer_s * factor)

    async def register(self, shard: Shard) -> None:
        """POST the node's record to the gateway (start the node first)."""
        record = shard.record(self.node_urls[shard.node_id])
        async with self.session.post(self.url + "/v1/nodes", json=record) as resp:
            assert resp.status in (200, 201), await resp.text()

    async def remove(self, node_id: str) -> None:
        """DELETE the node from the gateway (the node itself keeps running)."""
        async with self.session.delete(f"{self.url}/v1/nodes/{node_id}") as resp:
            assert resp.status == 200, await resp.text()

    async def chat(self, model: str, rng: random.Random, max_tokens: int = 12) -> None:
        """One chat request through the gateway, streaming or not."""
        body = {"model": model, "stream": rng.random() < 0.5, "max_tokens": max_tokens,
                "messages": [{"role": "user", "content": "tell me about meshes"}]}
        async with self.session.post(self.url + "/v1/chat/completions", json=body) as resp:
            await resp.read()
            if resp.status == 200:
                self.ok += 1
            else:
                self.failed += 1

    async def traffic(self, models: list[str], requests: int, clients: int = 3,
                      seed: int = 1) -> None:
        """`requests` chat requests in all, spread over the models, `clients` at a time."""
        rng = random.Random(seed)
        plan = [models[i % len(models)] for i in range(requests)]
        rng.shuffle(plan)
        queue: asyncio.Queue[str] = asyncio.Queue()
        for model in plan:
            queue.put_nowait(model)

        async def client(i: int) -> None:
            own = random.Random(seed * 100 + i)
            while not queue.empty():
                await self.chat(queue.get_nowait(), own)

        await asyncio.gather(*(client(i) for i in range(clients)))


@contextlib.asynccontextmanager
async def live_mesh(shards: tuple[Shard, ...] = QWEN + LLAMA,
                    half_life_s: float = 30.0) -> AsyncIterator[LiveMesh]:
    """A gateway on a free loopback port with `shards` started and registered."""
    settings = ServeSettings(host="127.0.0.1", port=0, mdns=False, seed=7,
                             router=RouterConfig(half_life_s=half_life_s),
                             health_interval_s=2.0, log_level="warning")
    gateway = build_gateway(settings)
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(serve_app(gateway.app, "127.0.0.1", 0))
        session = await stack.enter_async_context(aiohttp.ClientSession())
        mesh = LiveMesh(gateway, url, session, stack)
        for i, shard in enumerate(shards):
            await mesh.start_node(shard, seed=i)
            await mesh.register(shard)
        yield mesh
