"""`meshroute demo`: a whole emulated mesh on this machine, learning live.

Starts emulated shard nodes and a tracker gateway on 127.0.0.1, registers the nodes, sends a
steady stream of chat requests through the gateway and shows, refreshed live, what the router
learns: every candidate route, its learned tokens/s against what the emulator really does, its
traffic share and status. Half-way the best node slows down (drift) and the router re-learns.
The dashboard of the same gateway is at http://127.0.0.1:PORT/dashboard.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import random
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from node_agent.announcer import NodeAnnouncer
from node_agent.emulator import EmulatorConfig, serve_node
from node_agent.serving import serve_app

from ..core import RouterConfig, parse_node
from .serve import build_gateway
from .settings import ServeSettings

MODEL = "qwen-demo"
LAYERS = 40


@dataclass(frozen=True, slots=True)
class DemoNode:
    """One emulated node of the demo mesh; tps is for its own shard."""

    node_id: str
    start: int
    end: int
    tps: float
    slots: int = 4


# ADR-0020's mixed topology and then some: GPU boxes with half the layers, CPU boxes with all.
MESH = (
    DemoNode("gpu-a", 0, 21, 150.0, slots=6),
    DemoNode("gpu-b", 0, 19, 80.0),
    DemoNode("cpu-a", 0, 39, 30.0),
    DemoNode("cpu-b", 0, 39, 22.0),
    DemoNode("cpu-c", 20, 39, 100.0, slots=6),
)
HALF_LIFE_S = 30.0  # short, so that the demo re-learns within a minute of the drift
LOOPBACK = "127.0.0.1"  # mDNS stays on this machine: nothing multicasts onto a real network
DISCOVERY_WAIT_S = 10.0


@dataclass
class Stats:
    """What the load generator saw."""

    started: float = field(default_factory=time.monotonic)
    ok: int = 0
    failed: int = 0
    tokens: int = 0
    recent: deque[tuple[float, int]] = field(default_factory=lambda: deque(maxlen=400))
    last: deque[str] = field(default_factory=lambda: deque(maxlen=6))
    drift: str = ""

    def tokens_per_s(self, window_s: float = 10.0) -> float:
        """Delivered tokens/s over the last `window_s` seconds."""
        now = time.monotonic()
        toks = sum(n for t, n in self.recent if now - t <= window_s)
        return toks / min(window_s, max(now - self.started, 1e-3))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `meshroute demo`."""
    parser.add_argument("--port", type=int, default=8080, help="gateway port on 127.0.0.1")
    parser.add_argument("--duration", type=float, default=0.0,
                        help="seconds to run (0: until Ctrl-C)")
    parser.add_argument("--clients", type=int, default=6, help="concurrent chat clients")
    parser.add_argument("--max-tokens", type=int, default=24, help="tokens per request")
    parser.add_argument("--drift-after", type=float, default=45.0,
                        help="seconds until the best node slows to a third (0: never)")
    parser.add_argument("--policy", default=None, help="routing policy (default: the best)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--discovery", choices=("mdns", "http"), default="mdns",
                        help="how the gateway learns the nodes: mDNS on 127.0.0.1 (zero "
                             "configuration) or POST /v1/nodes")
    parser.add_argument("--plain", action="store_true",
                        help="print a summary line every few seconds instead of a live table")


def run(args: argparse.Namespace) -> int:
    """Run the demo until the duration ends or Ctrl-C."""
    problem = _port_problem("127.0.0.1", args.port)
    if problem:
        print(f"meshroute demo: cannot listen on 127.0.0.1:{args.port} ({problem}); "
              "choose another port with --port (0: any free port)", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_demo(args))
    return 0


def _port_problem(host: str, port: int) -> str:
    """Why host:port cannot be listened on, or '' when it can."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return ""


async def _demo(args: argparse.Namespace) -> None:
    router = RouterConfig(half_life_s=HALF_LIFE_S)
    if args.policy is not None:
        router = dataclasses.replace(router, policy=args.policy)
    mdns = args.discovery == "mdns"
    settings = ServeSettings(host="127.0.0.1", port=args.port, mdns=mdns,
                             mdns_interfaces=LOOPBACK, health_interval_s=1.0, seed=args.seed,
                             router=router, tracker_id="demo", log_level="warning")
    gateway = build_gateway(settings)
    stats = Stats()
    async with contextlib.AsyncExitStack() as stack:
        nodes: dict[str, Any] = {}
        for i, spec in enumerate(MESH):
            config = EmulatorConfig(node_id=spec.node_id, model=MODEL, start=spec.start,
                                    end=spec.end, layers=LAYERS, tps=spec.tps,
                                    slots=spec.slots, noise_sigma=0.1, seed=args.seed + i,
                                    hop_latency_s=0.0005)
            node, url = await stack.enter_async_context(serve_node(config))
            nodes[spec.node_id] = (node, url)
        gw_url = await stack.enter_async_context(serve_app(gateway.app, "127.0.0.1", args.port))
        session = await stack.enter_async_context(aiohttp.ClientSession())
        if mdns:
            await _announce(stack, nodes, gateway)
        if len(gateway.router.topology.nodes()) < len(MESH):
            if mdns:
                print("meshroute demo: mDNS found no nodes in time on this machine's loopback; "
                      "registering them over HTTP instead", file=sys.stderr)
            for spec in MESH:
                await _register(session, gw_url, spec, nodes[spec.node_id][1])
        _banner(gw_url, args)
        await _drive(args, session, gw_url, gateway, nodes, stats)


async def _announce(stack: contextlib.AsyncExitStack, nodes: dict[str, Any],
                    gateway: Any) -> None:
    """Zero configuration: every node announces itself over mDNS on loopback, each keeping
    its queue depth and measured speed current, and the gateway finds them by browsing."""
    print(f"meshroute demo: {len(MESH)} nodes announcing themselves over mDNS on "
          f"{LOOPBACK} ...", flush=True)
    followers: list[asyncio.Task[None]] = []
    for spec in MESH:
        node, url = nodes[spec.node_id]
        record = parse_node({"node_id": spec.node_id, "model": MODEL, "start": spec.start,
                             "end": spec.end, "layers": LAYERS, "url": url, "tps": spec.tps})
        announcer = NodeAnnouncer(record, interfaces=LOOPBACK)
        await announcer.start()
        stack.push_async_callback(announcer.close)
        followers.append(asyncio.create_task(announcer.follow(_load_of(node))))
    stack.callback(lambda: [f.cancel() for f in followers])
    deadline = time.monotonic() + DISCOVERY_WAIT_S
    while time.monotonic() < deadline:
        if len(gateway.router.topology.nodes()) == len(MESH):
            print(f"meshroute demo: the gateway discovered all {len(MESH)} nodes", flush=True)
            return
        await asyncio.sleep(0.1)


def _load_of(node: Any) -> Callable[[], tuple[int, float]]:
    """What a node agent announces as its load: queue depth and measured tokens/s."""
    return lambda: (node.queue_depth, node.measured_tps)


async def _register(session: aiohttp.ClientSession, gw_url: str, spec: DemoNode,
                    url: str) -> None:
    record = {"node_id": spec.node_id, "model": MODEL, "start": spec.start, "end": spec.end,
              "layers": LAYERS, "url": url, "tps": spec.tps}
    async with session.post(gw_url + "/v1/nodes", json=record) as resp:
        resp.raise_for_status()


def _banner(gw_url: str, args: argparse.Namespace) -> None:
    print(f"\nmeshroute demo: {len(MESH)} emulated nodes, gateway {gw_url}\n"
          f"  dashboard   {gw_url}/dashboard\n  routing     {gw_url}/v1/routing\n"
          f"  try         curl -s {gw_url}/v1/chat/completions -d "
          f"'{{\"model\": \"{MODEL}\", \"messages\": [{{\"role\": \"user\", "
          f"\"content\": \"hi\"}}]}}'\n", flush=True)


async def _drive(args: argparse.Namespace, session: aiohttp.ClientSession, gw_url: str,
                 gateway: Any, nodes: dict[str, Any], stats: Stats) -> None:
    stop = asyncio.Event()
    stats.started = time.monotonic()  # the clock starts with the traffic, not with discovery
    tasks = [asyncio.create_task(_client(i, args, session, gw_url, stats, stop))
             for i in range(args.clients)]
    tasks.append(asyncio.create_task(_drift(args, gateway, nodes, stats, stop)))
    view = _Plain() if args.plain or not sys.stdout.isatty() else _Live()
    try:
        while not stop.is_set():
            view.show(gateway, nodes, stats)
            if args.duration and time.monotonic() - stats.started >= args.duration:
                break
            await asyncio.sleep(0.5)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        view.close(gateway, nodes, stats)


async def _client(i: int, args: argparse.Namespace, session: aiohttp.ClientSession,
                  gw_url: str, stats: Stats, stop: asyncio.Event) -> None:
    rng = random.Random(args.seed * 100 + i)
    while not stop.is_set():
        stream = rng.random() < 0.5
        body = {"model": MODEL, "stream": stream, "max_tokens": args.max_tokens,
                "messages": [{"role": "user", "content": "tell me about meshes"}]}
        try:
            async with session.post(gw_url + "/v1/chat/completions", json=body) as resp:
                data = await resp.read()
                route = resp.headers.get("x-meshroute-route", "?").split("|", 1)[-1]
                mode = resp.headers.get("x-meshroute-mode", "?")
            ok = resp.status == 200 and b'"error"' not in data[-300:]
        except aiohttp.ClientError:
            ok, route, mode = False, "?", "?"
        if ok:
            stats.ok += 1
            stats.tokens += args.max_tokens
            stats.recent.append((time.monotonic(), args.max_tokens))
        else:
            stats.failed += 1
        stats.last.append(f"{mode:<15} {route}")
        await asyncio.sleep(rng.uniform(0.0, 0.05))


async def _drift(args: argparse.Namespace, gateway: Any, nodes: dict[str, Any],
                 stats: Stats, stop: asyncio.Event) -> None:
    if not args.drift_after:
        return
    await asyncio.sleep(args.drift_after)
    node, _ = nodes["gpu-a"]
    cfg = node.worker.config
    shard_tps = 1.0 / (cfg.layer_s * cfg.shard_layers)
    node.worker.config = dataclasses.replace(cfg, tps=shard_tps / 3)
    stats.drift = (f"t+{args.drift_after:.0f}s: gpu-a slowed to a third "
                   f"({shard_tps:.0f} -> {shard_tps / 3:.0f} tok/s on its shard)")


def true_route_tps(hops: list[dict[str, Any]], nodes: dict[str, Any]) -> float:
    """What the emulator really does on a route: 1 / Σ(layers × seconds per layer)."""
    per_token = sum((h["end_layer"] - h["start_layer"] + 1)
                    * nodes[h["node_id"]][0].worker.config.layer_s for h in hops)
    return 1.0 / per_token if per_token > 0 else 0.0


BOLD, DIM, RESET = "\x1b[1m", "\x1b[2m", "\x1b[0m"
COLOURS = {"proven": "\x1b[32m", "unsampled": "\x1b[90m", "stale": "\x1b[35m",
           "decayed": "\x1b[33m"}


def _table(gateway: Any, nodes: dict[str, Any], colour: bool) -> list[str]:
    doc = gateway.router.routing_table(MODEL)
    model = doc["models"].get(MODEL)
    if not model:
        return ["  (waiting for nodes)"]
    lines = [f"  {'route':<34} {'learned':>8} {'true':>7} {'share':>16} {'samples':>7}  status"]
    for row in model["candidates"]:
        route = "→".join(f"{h['node_id']}[{h['start_layer']}-{h['end_layer']}]"
                         for h in row["hops"])
        tps = "—" if row["tps"] is None else f"{row['tps']:.1f}"
        true = true_route_tps(row["hops"], nodes)
        bar = "█" * round(row["share"] * 10)
        status = row["status"]
        if colour:
            status = COLOURS.get(status, "") + status + RESET
        lines.append(f"  {route:<34} {tps:>8} {true:>7.1f} {bar:<10}{row['share']:>5.0%} "
                     f"{row['samples']:>7}  {status}")
    return lines


class _Live:
    """Redraws the screen in place (ANSI), like top."""

    def show(self, gateway: Any, nodes: dict[str, Any], stats: Stats) -> None:
        cfg = gateway.router.config
        up = time.monotonic() - stats.started
        out = ["\x1b[H\x1b[J", f"{BOLD}meshroute demo{RESET} {DIM}— model {MODEL}, "
               f"policy {cfg.policy}, up {up:4.0f}s   (Ctrl-C to stop){RESET}", "",
               *_table(gateway, nodes, True), "",
               f"  requests ok {stats.ok}   failed {stats.failed}   delivered "
               f"{stats.tokens_per_s():6.1f} tok/s (10 s window)"]
        if stats.drift:
            out.append(f"  {BOLD}drift{RESET} {stats.drift}")
        out += ["", f"  {DIM}last requests (mode, route):{RESET}",
                *(f"    {line}" for line in stats.last)]
        sys.stdout.write("\n".join(out) + "\n")
        sys.stdout.flush()

    def close(self, gateway: Any, nodes: dict[str, Any], stats: Stats) -> None:
        print(f"\nstopped after {time.monotonic() - stats.started:.0f}s: {stats.ok} requests "
              f"served, {stats.failed} failed.")


class _Plain:
    """A summary line every few seconds (for logs and pipes)."""

    def __init__(self) -> None:
        self._next = 0.0

    def show(self, gateway: Any, nodes: dict[str, Any], stats: Stats) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + 5.0
        print(f"[{now - stats.started:5.0f}s] ok {stats.ok} failed {stats.failed} "
              f"delivered {stats.tokens_per_s():.1f} tok/s", flush=True)
        if stats.drift:
            print(f"  drift: {stats.drift}")
        print("\n".join(_table(gateway, nodes, False)), flush=True)

    def close(self, gateway: Any, nodes: dict[str, Any], stats: Stats) -> None:
        self._next = 0.0
        self.show(gateway, nodes, stats)
