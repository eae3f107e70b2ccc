"""The demo's run: start the mesh and the gateway, drive traffic and the timeline, stop."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from meshroute_middleware.app.config import GatewayConfig
from meshroute_middleware.app.demo.mesh import (
    CLIENT_SHARE,
    DRIFTER,
    JOINER,
    LEAVER,
    LOOPBACK,
    MESH,
    QWEN,
    DemoNode,
    LiveNode,
    parse_signature,
    present_nodes,
    register,
    route_true_tps,
)
from meshroute_middleware.app.demo.providers import (
    CHAIN_MODEL,
    CHAIN_SHARE,
    LIMIT,
    PROVIDER_ROUTE,
    WINDOW_S,
    ChainWatch,
    provider_routes,
)
from meshroute_middleware.app.demo.tally import Tally
from meshroute_middleware.app.demo.view import Live, Plain, best_true_tps
from meshroute_middleware.app.gateway import Gateway, build_gateway
from meshroute_middleware.app.settings import ServeSettings, load_settings
from meshroute_middleware.chat.providers.tally import H_TRIED
from meshroute_middleware.core import NodeRecord, RouterConfig
from meshroute_middleware.core.contracts.cache import CACHE_HEADER, parse_cache
from meshroute_middleware.core.contracts.plan import MODE_HEADER, ROUTE_HEADER
from meshroute_middleware.telemetry.requests import answered
from node_agent.serving import ListenError, listen_socket, serve_app

# The demo's conversations (issue 26): a long system message, then short turns; each turn
# carries the history, so its prompt grows and a warm node skips most of its prefill.
ONE_SHOT = [{"role": "user", "content": "tell me about meshes"}]
SYSTEMS = ("You are a patient guide to mesh networks. ", "You answer as a terse engineer. ")
FOLLOW_UPS = ("and then?", "why is that?", "give me an example", "how does it fail?",
              "what would you measure?")
CONVERSATION_TURNS = (3, 6)
SYSTEM_REPEAT = 40  # ~1,600 characters, ~400 tokens of system message


def conversation_start(rng: random.Random) -> list[dict[str, str]]:
    """A new conversation's first prompt."""
    return [{"role": "system", "content": rng.choice(SYSTEMS) * SYSTEM_REPEAT},
            {"role": "user", "content": f"tell me about meshes ({rng.randrange(10**6)})"}]


def answer_text(data: bytes, stream: bool) -> str:
    """The assistant's text of an answer: the JSON's message, or a stream's deltas joined."""
    if not stream:
        with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
            return str(json.loads(data)["choices"][0]["message"]["content"])
        return ""
    parts: list[str] = []
    for line in data.decode("utf-8", "replace").splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        with contextlib.suppress(ValueError, KeyError, IndexError, TypeError):
            delta = json.loads(line[6:])["choices"][0]["delta"]
            parts.append(str(delta.get("content") or ""))
    return "".join(parts)


HALF_LIFE_S = 30.0  # short, so that the demo re-learns within a minute of a change
DISCOVERY_WAIT_S = 10.0
TICK_S = 0.5
SHUTDOWN_GRACE_S = 1  # backstop: no open connection holds the exit longer
UsedShare = 0.25  # a joined node's route is "used" once it carries this share of its model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of `meshroute demo`."""
    parser.add_argument("--port", type=int, default=8080,
                        help="gateway port on 127.0.0.1 (0: any free port)")
    parser.add_argument("--seconds", "--duration", dest="seconds", type=float, default=0.0,
                        help="seconds of traffic before stopping (0: until Ctrl-C)")
    parser.add_argument("--requests", type=int, default=0,
                        help="stop once this many requests were answered (0: no bound; with "
                        "--seconds, whichever comes first)")
    parser.add_argument("--clients", type=int, default=6, help="concurrent chat clients")
    parser.add_argument("--max-tokens", type=int, default=24, help="tokens per request")
    parser.add_argument("--leave-after", type=float, default=20.0,
                        help=f"seconds until {LEAVER} leaves the mesh (0: never)")
    parser.add_argument("--join-after", type=float, default=30.0,
                        help=f"seconds until {JOINER.node_id} joins the mesh (0: never)")
    parser.add_argument("--drift-after", type=float, default=45.0,
                        help=f"seconds until {DRIFTER} slows to a third (0: never)")
    parser.add_argument("--policy", default=None, help="routing policy (default: the best)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--discovery", choices=("mdns", "http"), default="mdns",
                        help="how the gateway learns the nodes: mDNS on 127.0.0.1 (zero "
                             "configuration) or POST /v1/nodes")
    parser.add_argument("--no-providers", dest="providers", action="store_false",
                        help=f"leave out the provider chain ('{CHAIN_MODEL}': a rate-limited "
                             f"fake provider, then {QWEN} on the mesh)")
    parser.add_argument("--plain", action="store_true",
                        help="print a status line every few seconds instead of a live table")


def run(args: argparse.Namespace) -> int:
    """Run the demo until `--seconds` end or Ctrl-C; a second Ctrl-C stops at once."""
    try:  # a port in use: one line before anything starts
        listen_socket(LOOPBACK, args.port).close()
    except ListenError as exc:
        print(f"meshroute demo: {exc.strerror}; choose another port with --port (0: any free "
              "port)", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_main(args))
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130


async def _main(args: argparse.Namespace) -> int:
    """Ctrl-C and SIGTERM set `stop`: the demo winds down by itself, quietly."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None

    def on_signal() -> None:
        if stop.is_set():
            main.cancel()  # asked twice: stop now
        stop.set()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    try:
        tally = await Demo(args, stop).run()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
    print(tally.summary(), flush=True)
    return 0


class Demo:
    """One run of the demo: the gateway, the live nodes, the clients and the timeline."""

    gateway: Gateway  # built when the run starts (after the fake provider, if any)

    def __init__(self, args: argparse.Namespace, stop: asyncio.Event) -> None:
        self.args, self.stop = args, stop
        router = RouterConfig(half_life_s=HALF_LIFE_S)
        if args.policy is not None:
            router = dataclasses.replace(router, policy=args.policy)
        self.mdns = args.discovery == "mdns"
        self.settings = ServeSettings(host=LOOPBACK, port=args.port, mdns=self.mdns,
                                      mdns_interfaces=LOOPBACK, health_interval_s=1.0,
                                      seed=args.seed, router=router, tracker_id="demo",
                                      log_level="warning")
        self.tally = Tally()
        self.nodes: dict[str, LiveNode] = {}
        self.watch: dict[str, str] = {}  # joined node -> what is still to announce about it
        self.chain: ChainWatch | None = None  # the provider chain, unless --no-providers
        self.view = (Plain(router.policy) if args.plain or not sys.stdout.isatty()
                     else Live(router.policy))

    async def _build(self, stack: contextlib.AsyncExitStack) -> Gateway:
        """The gateway; with the provider chain, the fake provider runs first and the gateway
        loads the config it wrote as `meshroute serve --config` does (docs/providers.md)."""
        if not self.args.providers:
            return build_gateway(self.settings)
        directory = Path(stack.enter_context(tempfile.TemporaryDirectory(
            prefix="meshroute-demo-")))
        fake = await provider_routes(stack, directory)
        from_file = load_settings({"config": str(fake.config)}, {})
        settings = dataclasses.replace(self.settings, providers=from_file.providers,
                                       state_file=":memory:")
        gateway = build_gateway(GatewayConfig.build(settings, {**os.environ, **fake.environ}))
        self.chain = ChainWatch(gateway)
        self.tally.chain = self.chain.counts
        self.view.chain = self.chain
        return gateway

    async def run(self) -> Tally:
        """Start everything, drive it until stopped, stop everything; return the tally."""
        async with contextlib.AsyncExitStack() as stack:
            self.gateway = await self._build(stack)
            self.url = await stack.enter_async_context(
                serve_app(self.gateway.app, LOOPBACK, self.args.port, graceful_s=SHUTDOWN_GRACE_S))
            self.session = await stack.enter_async_context(aiohttp.ClientSession())
            try:
                for spec in MESH:
                    self._start(spec)
                if await self._discovered():
                    self._banner()
                    await self._drive()
            finally:
                await self._stop_nodes()
                self.gateway.telemetry.events.close()  # a dashboard's event stream ends
        return self.tally

    # -- the mesh ----------------------------------------------------------------------
    def _start(self, spec: DemoNode) -> LiveNode:
        live = LiveNode(spec, seed=self.args.seed + len(self.nodes))
        self.nodes[spec.node_id] = live
        live.start(self.gateway, None if self.mdns else (self.session, self.url))
        return live

    async def _discovered(self) -> bool:
        """Wait until every node is up and known to the gateway; False when stopped first."""
        if self.mdns:
            print(f"meshroute demo: {len(MESH)} nodes announcing themselves over mDNS on "
                  f"{LOOPBACK} ...", flush=True)
        deadline = time.monotonic() + DISCOVERY_WAIT_S
        while not self.stop.is_set() and time.monotonic() < deadline:
            if len(present_nodes(self.gateway)) == len(MESH):
                if self.mdns:
                    print(f"meshroute demo: the gateway discovered all {len(MESH)} nodes",
                          flush=True)
                return True
            await self._sleep(0.1)
        if self.stop.is_set():
            return False
        missing = [live for nid, live in self.nodes.items()
                   if nid not in present_nodes(self.gateway) and live.ready.is_set()]
        print("meshroute demo: mDNS found no nodes in time on this machine's loopback; "
              "registering them over HTTP instead", file=sys.stderr)
        for live in missing:
            await register(self.session, self.url, live)
        return True

    async def _stop_nodes(self) -> None:
        """Every node says goodbye at once (concurrently: each goodbye takes a moment)."""
        for live in self.nodes.values():
            live.leave(drain=False)
        tasks = [live.task for live in self.nodes.values() if live.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- traffic and timeline ----------------------------------------------------------
    async def _drive(self) -> None:
        self.tally.started = time.monotonic()  # the clock starts with the traffic
        clients = [asyncio.create_task(self._client(i)) for i in range(self.args.clients)]
        timeline = sorted((at, name) for at, name in (
            (self.args.leave_after, "leave"), (self.args.join_after, "join"),
            (self.args.drift_after, "drift")) if at > 0)
        actions: dict[str, Callable[[], None]] = {
            "leave": self._leave, "join": self._join, "drift": self._drift}
        known = present_nodes(self.gateway)
        try:
            while not self.stop.is_set():
                self.tally.best_tps = best_true_tps(self.gateway, self.nodes)
                while timeline and self.tally.elapsed_s() >= timeline[0][0]:
                    actions[timeline.pop(0)[1]]()
                known = self._changes(known)
                self._followed()
                if self.chain is not None:
                    for line in self.chain.tick(time.time()):  # the gateway's clock
                        self._event(line)
                self.view.show(self.gateway, self.nodes, self.tally)
                if self.args.seconds and self.tally.elapsed_s() >= self.args.seconds:
                    break
                if self.args.requests and self.tally.ok + self.tally.failed >= self.args.requests:
                    break
                await self._sleep(TICK_S)
        finally:
            for task in clients:
                task.cancel()
            await asyncio.gather(*clients, return_exceptions=True)
            self.view.close(self.gateway, self.nodes, self.tally)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, waking early when the demo is stopped."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    def _event(self, text: str) -> None:
        self.view.event(self.tally.event(text))

    def _leave(self) -> None:
        live = self.nodes.get(LEAVER)
        if live is None:
            return
        how = "an mDNS goodbye" if self.mdns else "DELETE /v1/nodes"
        self._event(f"{LEAVER} leaves the mesh: {how}, then it drains its requests and stops")
        live.leave()

    def _join(self) -> None:
        how = "announces itself over mDNS" if self.mdns else "registers over HTTP"
        self._event(f"{JOINER.node_id} ({JOINER.model} layers {JOINER.start}-{JOINER.end}, "
                    f"{JOINER.tps:.0f} tok/s) joins and {how}")
        self._start(JOINER)
        self.watch[JOINER.node_id] = "first request"

    def _drift(self) -> None:
        live = self.nodes.get(DRIFTER)
        if live is None or live.node is None:
            return
        before, after = live.slow_down(3.0)
        self._event(f"{DRIFTER} slows to a third ({before:.0f} -> {after:.0f} tok/s on its "
                    "shard): watch the router re-learn")

    def _changes(self, known: dict[str, NodeRecord]) -> dict[str, NodeRecord]:
        """Announce what the gateway itself saw join or leave since the last tick."""
        now = present_nodes(self.gateway)
        for node_id in known.keys() - now.keys():
            failed = self.tally.failed
            self._event(f"gateway dropped {node_id}: its routes are gone "
                        f"({failed} failed requests so far)")
        for node_id in now.keys() - known.keys():
            routes = [r for r in self.gateway.router.candidates(now[node_id].model)
                      if any(h.node.node_id == node_id for h in r.hops)]
            names = ", ".join(r.signature.split("|", 1)[-1] for r in routes) or "none"
            self._event(f"gateway discovered {node_id}: new route {names}, to be scouted")
        return now

    def _followed(self) -> None:
        """Announce when a joined node's route starts carrying a real share of traffic."""
        for node_id, stage in list(self.watch.items()):
            if stage != "used":
                continue
            model = self.nodes[node_id].spec.model
            rows = self.gateway.router.routing_table(model)["models"].get(model, {})
            share = sum(r["share"] for r in rows.get("candidates", ())
                        if r["status"] == "proven"
                        and any(h["node_id"] == node_id for h in r["hops"]))
            if share >= UsedShare:
                self._event(f"{node_id}'s route is proven and now carries {share:.0%} of "
                            f"{model}")
                del self.watch[node_id]

    async def _client(self, i: int) -> None:
        rng = random.Random(self.args.seed * 100 + i)
        shares = dict(CLIENT_SHARE)
        if self.chain is not None:
            shares[CHAIN_MODEL] = CHAIN_SHARE
        models, weights = list(shares), list(shares.values())
        talks = i % 2 == 1  # every second client holds multi-turn conversations
        while True:
            if talks:
                await self._conversation(rng, rng.choice(list(CLIENT_SHARE)))
            else:
                model = rng.choices(models, weights)[0]
                await self._request(model, ONE_SHOT, stream=rng.random() < 0.5)
            await asyncio.sleep(rng.uniform(0.0, 0.05))

    async def _conversation(self, rng: random.Random, model: str) -> None:
        """One conversation of a few turns: each turn sends the whole history so far, so a
        node that served the turn before holds its prefix in its cache."""
        messages = conversation_start(rng)
        for turn in range(rng.randint(*CONVERSATION_TURNS)):
            answer = await self._request(model, messages, rng.random() < 0.5, turn > 0)
            if answer is None:
                return  # a failed turn ends the conversation (a client would retry it)
            messages = [*messages, {"role": "assistant", "content": answer},
                        {"role": "user", "content": rng.choice(FOLLOW_UPS)}]

    async def _request(self, model: str, messages: list[dict[str, str]], stream: bool,
                       returning: bool = False) -> str | None:
        """One chat request, tallied; the answer's text, None if it failed."""
        body = {"model": model, "stream": stream, "max_tokens": self.args.max_tokens,
                "messages": messages}
        began = time.monotonic()
        note = None
        try:
            async with self.session.post(self.url + "/v1/chat/completions",
                                         json=body) as resp:
                data = await resp.read()
                signature = resp.headers.get(ROUTE_HEADER, "?")
                mode = resp.headers.get(MODE_HEADER, "chain")
                tried = resp.headers.get(H_TRIED.decode(), "")
                note = parse_cache(resp.headers.get(CACHE_HEADER))
            ok = answered(resp.status, data)  # as the gateway counts it (the dashboard's header)
        except aiohttp.ClientError:
            ok, signature, mode, tried, data = False, "?", "?", "", b""
        wall_s = time.monotonic() - began
        route = signature.split("|", 1)[-1]
        mark = ""
        if not ok:
            self.tally.failed += 1
        else:
            hops = parse_signature(signature)
            self.tally.served(model, self.args.max_tokens, wall_s,
                              route_true_tps(hops, self.nodes))
            mark = self.tally.noted(note, returning)
            self._first_use(hops, mode)
            if self.chain is not None and model == CHAIN_MODEL:
                line = self.chain.answered(signature, [t for t in tried.split(",") if t])
                if line:
                    self._event(line)
                if "|" in signature:
                    route = f"{signature.split('|', 1)[0]} {route}"
        self.tally.last.append(f"{mode:<15} {mark:<10} {route}")
        return answer_text(data, stream) if ok else None

    def _first_use(self, hops: list[dict[str, object]], mode: str) -> None:
        for hop in hops:
            node_id = str(hop["node_id"])
            if self.watch.get(node_id) == "first request":
                self._event(f"first request through {node_id} (mode {mode})")
                self.watch[node_id] = "used"

    def _banner(self) -> None:
        print(f"\nmeshroute demo: {len(MESH)} emulated nodes, gateway {self.url}\n"
              f"  dashboard   {self.url}/dashboard\n  routing     {self.url}/v1/routing\n"
              f"  try         curl -s {self.url}/v1/chat/completions -d "
              f"'{{\"model\": \"{QWEN}\", \"messages\": [{{\"role\": \"user\", "
              f"\"content\": \"hi\"}}]}}'", flush=True)
        if self.chain is not None:
            print(f"  chain       model '{CHAIN_MODEL}': {PROVIDER_ROUTE} (a fake provider that "
                  f"allows {LIMIT} requests per {WINDOW_S:.0f} s), then {QWEN} on the mesh\n"
                  f"              {self.url}/v1/routing/chain?model={CHAIN_MODEL}", flush=True)
        print(flush=True)
