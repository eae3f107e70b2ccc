"""Real-time learning check: a real `meshroute serve` over HTTP in front of emulated nodes.

  python benchmarks/bench_realtime.py [--seconds 20] [--clients 1,4,16] [--case NAME]
      [--policy NAME] [--trace DIR] [--json PATH]
  python benchmarks/bench_realtime.py --conversation [--seconds 20] [--clients 4,16]
      [--case equal|slow-a]
  python benchmarks/bench_realtime.py --mesh [--seconds 20] [--layout one|2/2/2|4/1/1]
      [--before DIR]
  python benchmarks/bench_realtime.py --engine llama-server [--runs 5]

`--engine llama-server` (issue 31) runs the conversation workload on two real llama.cpp
servers instead (benchmarks/_engine_conv.py; scripts/ensure-llama-server builds them).

`--conversation` (issue 26) runs the conversation case instead: see `run_conversation`.

Per scenario, three single-node routes run as emulated nodes (each its own process on
127.0.0.1) whose behaviour the gateway is not told: serial servers, batching servers with
room, or a fast server whose batch saturates. `meshroute serve --no-mdns --nodes-file`
fronts them, announcing each node's solo speed. N closed-loop clients (1, 4, 16) send
non-streaming chat completions of TOKENS tokens for `--seconds`; delivered tokens/s counts the
completion tokens of successful answers over the wall time, learning included.

The best achievable is measured, not assumed: the same clients call the nodes directly,
spread as the best split says (`sim.oracle.best_split` on the nodes' true saturation curves;
with a roomy fast server that is all of them on the fast one). Each policy's tok/s is
reported as a fraction of it. Runs of one scenario interleave so a noisy neighbour hurts all
alike. Bounded: every run stops at its deadline, every request has a timeout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from meshroute_middleware.core.prefix import message_chain
from meshroute_middleware.core.sim.model import NodeSpec, batching, serial
from meshroute_middleware.core.sim.oracle import best_split

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
MODEL = "emu-model"
TOKENS = 32  # completion tokens per request
REQUEST_TIMEOUT_S = 30.0
POLICIES = ("thompson", "epsilon-greedy")
RESULTS = Path(__file__).parent / "results" / "realtime.json"


@dataclass(frozen=True, slots=True)
class Case:
    """One mesh: its nodes' true behaviour (NodeSpec as in the simulator)."""

    name: str
    title: str
    nodes: tuple[NodeSpec, ...]


# Speeds of the independent check (900 / 600 / 300 tok/s) scaled by 1/5: the emulator sleeps
# per token, and 16 clients at 900 tok/s would measure the machine, not the routing.
CASES = (
    Case("roomy", "batching servers 180/120/60, 16 slots, 5 % per neighbour",
         (batching("fast", 180.0, 16, 0.05), batching("mid", 120.0, 16, 0.05),
          batching("slow", 60.0, 16, 0.05))),
    Case("saturating", "the fast server saturates: 2 slots, 30 % per neighbour",
         (batching("fast", 180.0, 2, 0.3), batching("mid", 120.0, 8, 0.05),
          batching("slow", 60.0, 8, 0.05))),
    Case("serial", "serial servers 180/120/60 (one request at a time)",
         (serial("fast", 180.0), serial("mid", 120.0), serial("slow", 60.0))),
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def node_command(spec: NodeSpec, port: int, tokens: int = TOKENS) -> list[str]:
    """An emulated node with the spec's solo speed, slots and batch slowdown."""
    config = {"node_id": spec.node_id, "model": MODEL, "tps": spec.shard_tps,
              "slots": spec.slots, "slot_slowdown": spec.slot_slowdown,
              "max_tokens_default": tokens, "max_queue": 4096}
    code = ("import anyio, json, sys\n"
            "from node_agent.emulator import EmulatorConfig, serve_node\n"
            "async def main():\n"
            "    async with serve_node(EmulatorConfig(**json.loads(sys.argv[1])), "
            "'127.0.0.1', int(sys.argv[2])):\n"
            "        await anyio.sleep_forever()\n"
            "anyio.run(main)\n")
    return [PY, "-c", code, json.dumps(config), str(port)]


# --trace: the gateway runs under a wrapper that logs every sample the thompson policy takes
# (route, tokens/s, concurrency, the curve's change count after it) as JSON lines; the
# policy's code is unchanged, only observed.
TRACE_WRAPPER = (
    "import json, sys, time\n"
    "from meshroute_middleware.core.policies import thompson\n"
    "out = open(sys.argv[1], 'a', buffering=1)\n"
    "orig = thompson.ThompsonPolicy.observe\n"
    "def observe(self, signature, outcome, now):\n"
    "    orig(self, signature, outcome, now)\n"
    "    b = self._beliefs.get(signature)\n"
    "    out.write(json.dumps({'t': now, 'route': signature.split('|')[-1], 'ok': outcome.ok,\n"
    "        'tps': outcome.tps, 'c': outcome.concurrency,\n"
    "        'changes': b.curve.changes if b else 0}) + '\\n')\n"
    "thompson.ThompsonPolicy.observe = observe\n"
    "from meshroute_middleware.app.cli import main\n"
    "sys.argv = ['meshroute'] + sys.argv[2:]\n"
    "sys.exit(main())\n")


def gateway_command(nodes_file: str, port: int, policy: str,
                    trace: str | None = None, extra: list[str] | None = None) -> list[str]:
    args = ["serve", "--no-mdns", "--host", "127.0.0.1", "--port", str(port), "--nodes-file",
            nodes_file, "--policy", policy, "--log-level", "warning",
            *(extra or ["--seed", "1"])]
    if trace is not None:
        return [PY, "-c", TRACE_WRAPPER, trace, *args]
    return [PY, "-m", "meshroute_middleware.app.cli", *args]


async def wait_up(url: str, deadline_s: float = 30.0) -> None:
    """Until `url` answers HTTP at all (any status)."""
    end = time.monotonic() + deadline_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < end:
            try:
                async with session.get(url, timeout=aiohttp.ClientTimeout(total=1)):
                    return
            except (aiohttp.ClientError, TimeoutError, OSError):
                await asyncio.sleep(0.1)
    raise RuntimeError(f"{url} did not come up")


async def client(session: aiohttp.ClientSession, url: str, stop_at: float,
                 max_tokens: int = TOKENS) -> tuple[int, int]:
    """One closed-loop client until `stop_at`: (completion tokens delivered, failures)."""
    body = {"model": MODEL, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": "count to thirty-two"}]}
    tokens = failures = 0
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    while time.monotonic() < stop_at:
        try:
            async with session.post(url + "/v1/chat/completions", json=body,
                                    timeout=timeout) as resp:
                doc = await resp.json(content_type=None)
                if resp.status == 200:
                    tokens += int(doc["usage"]["completion_tokens"])
                else:
                    failures += 1
        except (aiohttp.ClientError, TimeoutError, ValueError, KeyError):
            failures += 1
    return tokens, failures


async def load(urls: list[str], seconds: float, tokens: int = TOKENS) -> dict[str, float]:
    """Closed-loop clients, client i on urls[i]; delivered tokens/s over the wall time."""
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        began = time.monotonic()
        results = await asyncio.gather(*(client(session, u, began + seconds, tokens)
                                         for u in urls))
        elapsed = time.monotonic() - began
    tokens = sum(t for t, _ in results)
    return {"tokens_per_s": tokens / elapsed, "failures": float(sum(f for _, f in results))}


def direct_urls(case: Case, node_urls: dict[str, str], clients: int) -> list[str]:
    """Client i's node under the best split of `clients` closed-loop clients."""
    split, _ = best_split(case.nodes, clients)
    out: list[str] = []
    for spec, k in zip(case.nodes, split, strict=True):
        out += [node_urls[spec.node_id]] * k
    return out


def start(cmd: list[str], tree: Path | None = None) -> subprocess.Popen[bytes]:
    """Run `cmd` on this checkout, or (`tree`: another checkout of the package, e.g. a
    `git archive` of an older commit) on that one, site-packages kept for the dependencies
    but not this checkout's editable install (`python -S`)."""
    if tree is None:
        return subprocess.Popen(cmd, cwd=ROOT, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    path = f"{tree}{os.pathsep}{sysconfig.get_paths()['purelib']}"
    return subprocess.Popen([cmd[0], "-S", *cmd[1:]], cwd=tree, start_new_session=True,
                            env={**os.environ, "PYTHONPATH": path})


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def run_case(case: Case, clients_list: list[int], seconds: float,
                   policies: tuple[str, ...] = POLICIES,
                   trace_dir: Path | None = None) -> dict[str, Any]:
    """Every client count and policy on one mesh; fresh nodes and gateway per run."""
    out: dict[str, Any] = {}
    for clients in clients_list:
        row: dict[str, Any] = {}
        for variant in ("best", *policies):
            procs: list[subprocess.Popen[bytes]] = []
            try:
                node_urls = {}
                for spec in case.nodes:
                    port = free_port()
                    procs.append(start(node_command(spec, port)))
                    node_urls[spec.node_id] = f"http://127.0.0.1:{port}"
                for url in node_urls.values():
                    await wait_up(url + "/v1/models")
                if variant == "best":
                    urls = direct_urls(case, node_urls, clients)
                    row[variant] = await load(urls, seconds)
                else:
                    trace = None if trace_dir is None else str(
                        trace_dir / f"{case.name}-{clients}-{variant}.jsonl")
                    url = await gateway(case, node_urls, variant, procs, trace)
                    row[variant] = await load([url] * clients, seconds)
                    row[variant]["requests_per_route"] = await requests_per_route(url)
            finally:
                for proc in procs:
                    stop(proc)
        best = row["best"]["tokens_per_s"]
        for variant in policies:
            row[variant]["fraction_of_best"] = row[variant]["tokens_per_s"] / best
        out[str(clients)] = row
        print(f"{case.name:10s} clients {clients:2d}: best {best:7.1f} tok/s  " + "  ".join(
            f"{p} {row[p]['fraction_of_best']:.3f} {row[p]['requests_per_route']}"
            for p in policies), flush=True)
    return out


async def requests_per_route(url: str) -> dict[str, Any]:
    """Per route head, the tps samples the gateway took and their decayed mean (its
    /v1/routing): where the traffic went and how fast the gateway saw it go."""
    async with aiohttp.ClientSession() as session, session.get(url + "/v1/routing") as resp:
        doc = await resp.json()
    return {c["head"]: [c["samples"], None if c["tps"] is None else round(c["tps"], 1)]
            for m in doc["models"].values() for c in m["candidates"]}


async def gateway(case: Case, node_urls: dict[str, str], policy: str,
                  procs: list[subprocess.Popen[bytes]], trace: str | None = None,
                  slots: bool = False, extra: list[str] | None = None,
                  tree: Path | None = None) -> str:
    """Start `meshroute serve` over the nodes; return its URL. `slots`: the records carry
    the nodes' slots, as `meshroute node` announces them (the conversation case; the
    issue-14 cases were measured before records had them, and keep their shape)."""
    nodes = [{"node_id": s.node_id, "model": MODEL, "start": 0, "end": s.layers - 1,
              "layers": s.layers, "url": node_urls[s.node_id], "tps": s.shard_tps,
              **({"slots": s.slots} if slots else {})}
             for s in case.nodes]
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump({"nodes": nodes}, f)
    port = free_port()
    procs.append(start(gateway_command(f.name, port, policy, trace, extra), tree))
    url = f"http://127.0.0.1:{port}"
    await wait_up(url + "/v1/routing")
    return url


# -- the conversation case (issue 26) -------------------------------------------------------
# Three whole-model nodes with prefix caches (prefill 1,000 prompt tokens/s, as the issue's
# outside check) and room for every client. Each closed-loop client holds conversations of
# CONV_TURNS turns, streaming: a system message of ~1,000 tokens, then each turn adds the
# answer and a new message of ~50 tokens. Time to first token is taken at the client (the
# first content chunk); the head node's x-meshroute-cache says whether the turn was warm.
#
# The yardstick, "best warm-or-cold" (`Oracle`): the clients call the nodes directly, and
# each turn goes to the node of least expected time to first token given what the oracle
# knows: every node's true prefill speed and which node holds the conversation's prefix (the
# one that served its last turn); ties (a new conversation on equal nodes) go to the node
# with the fewest of its requests in flight. On roomy nodes that is the best route of every
# turn: the prefill is the only cost that differs.
CONV_NODES = ("a", "b", "c")
CONV_TPS = 60.0
CONV_SLOTS = 16
CONV_PREFILL_TPS = 1000.0
CONV_FIRST_TOKEN_S = 0.02
CONV_CACHE_TOKENS = 64_000
CONV_TURNS = 6
CONV_SYSTEM_CHARS = 4000  # ~1,000 tokens (core/prefix.py counts 4 characters a token)
CONV_GOAL = 1.2  # issue 26: mean TTFT within 1.2x of the best warm-or-cold route
# case -> each node's speed factor (decode and prefill alike)
CONV_CASES: dict[str, tuple[float, ...]] = {
    "equal": (1.0, 1.0, 1.0),
    "slow-a": (0.2, 1.0, 1.0),  # node a at a fifth: a cold turn there pays 5x the prefill
}


def conv_node_command(node_id: str, port: int, factor: float = 1.0) -> list[str]:
    """An emulated whole-model node with a prefix cache, at `factor` of the case's speed."""
    config = {"node_id": node_id, "model": MODEL, "tps": CONV_TPS * factor,
              "slots": CONV_SLOTS, "slot_slowdown": 0.02, "max_tokens_default": TOKENS,
              "max_queue": 4096, "prefill_tps": CONV_PREFILL_TPS * factor,
              "cache_tokens": CONV_CACHE_TOKENS, "first_token_s": CONV_FIRST_TOKEN_S}
    return [*node_command(batching(node_id, CONV_TPS, CONV_SLOTS, 0.02), port)[:-2],
            json.dumps(config), str(port)]


class Oracle:
    """Picks each turn's node from the nodes' true prefill speeds and cache contents."""

    def __init__(self, urls: list[str], prefill_tps: list[float]) -> None:
        self.urls, self.prefill_tps = urls, prefill_tps
        self.flying = dict.fromkeys(urls, 0)

    def pick(self, prompt_tokens: int, warm: tuple[str, int] | None) -> str:
        """The node of least expected TTFT (`warm`: the node holding the prefix, and how many
        of the prompt's tokens it holds); the least busy on a tie."""
        def cost(i: int) -> tuple[float, int]:
            held = warm[1] if warm is not None and warm[0] == self.urls[i] else 0
            ttft = CONV_FIRST_TOKEN_S + (prompt_tokens - held) / self.prefill_tps[i]
            return round(ttft, 3), self.flying[self.urls[i]]
        url = self.urls[min(range(len(self.urls)), key=cost)]
        self.flying[url] += 1
        return url

    def done(self, url: str) -> None:
        self.flying[url] -= 1


class Gatewayed:
    """Every turn to `meshroute serve`, which chooses."""

    def __init__(self, url: str) -> None:
        self.url = url

    def pick(self, prompt_tokens: int, warm: tuple[str, int] | None) -> str:
        return self.url

    def done(self, url: str) -> None:
        pass


async def conv_turn(session: aiohttp.ClientSession, url: str,
                    messages: list[dict[str, str]]) -> tuple[float, str, str, str] | None:
    """One streamed turn: (seconds to the first content chunk, the answer, the cache state
    the head node reported, where it went: the gateway's route or the URL); None if it
    failed."""
    body = {"model": MODEL, "max_tokens": TOKENS, "stream": True, "messages": messages}
    began = time.monotonic()
    ttft: float | None = None
    parts: list[str] = []
    try:
        async with session.post(url + "/v1/chat/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)) as resp:
            if resp.status != 200:
                return None
            state = resp.headers.get("x-meshroute-cache", "?").split(";", 1)[0]
            where = resp.headers.get("x-meshroute-route", url).split("|")[-1]
            async for raw in resp.content:
                line = raw.decode().strip()
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                doc = json.loads(line[6:])
                text = (doc.get("choices") or [{}])[0].get("delta", {}).get("content")
                if text:
                    if ttft is None:
                        ttft = time.monotonic() - began
                    parts.append(text)
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    return (ttft, "".join(parts), state, where) if ttft is not None else None


async def conv_client(session: aiohttp.ClientSession, chooser: Oracle | Gatewayed,
                      stop_at: float, index: int) -> list[tuple[int, float, str, str]]:
    """Conversations until `stop_at`: (turn, time to first token, cache state, where) per
    answer."""
    out: list[tuple[int, float, str, str]] = []
    conversation = 0
    while time.monotonic() < stop_at:
        conversation += 1
        system = f"client {index} conversation {conversation}: ".ljust(CONV_SYSTEM_CHARS, "x")
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": "first question ".ljust(200, "q")}]
        warm: tuple[str, int] | None = None
        for turn in range(CONV_TURNS):
            if time.monotonic() >= stop_at:
                break
            prompt = message_chain(messages)
            tokens = prompt.prompt_tokens if prompt is not None else 0
            url = chooser.pick(tokens, warm)
            try:
                got = await conv_turn(session, url, messages)
            finally:
                chooser.done(url)
            if got is None:
                out.append((turn, float("nan"), "failed", url))
                break
            ttft, answer, state, where = got
            out.append((turn, ttft, state, where))
            messages = [*messages, {"role": "assistant", "content": answer}]
            held = message_chain(messages)
            warm = (url, held.prompt_tokens if held is not None else 0)
            messages.append({"role": "user", "content": f"question {turn + 2} ".ljust(200, "q")})
    return out


async def conv_load(choosers: list[Oracle | Gatewayed], seconds: float) -> dict[str, Any]:
    """Conversation clients, client i choosing with choosers[i]: mean and p95 time to first
    token, and the share of later turns that were warm."""
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        began = time.monotonic()
        runs = await asyncio.gather(*(conv_client(session, c, began + seconds, i)
                                      for i, c in enumerate(choosers)))
    turns = [t for run in runs for t in run]
    ok = [t for t in turns if t[2] != "failed"]
    later = [t for t in ok if t[0] > 0]
    ttfts = sorted(t[1] for t in ok)
    places: dict[str, list[float]] = {}
    for t in ok:  # per node: turns, of which cold, and their mean time to first token
        place = places.setdefault(t[3], [0, 0, 0.0])
        place[0] += 1
        place[1] += t[2] == "cold"
        place[2] += t[1]
    return {"turns": len(ok), "failures": len(turns) - len(ok),
            "per_node": {k: {"turns": int(n), "cold": int(c), "mean_ttft_s": round(x / n, 3)}
                         for k, (n, c, x) in sorted(places.items())},
            "mean_ttft_s": sum(ttfts) / len(ttfts) if ttfts else float("nan"),
            "p95_ttft_s": ttfts[int(0.95 * (len(ttfts) - 1))] if ttfts else float("nan"),
            "warm_share_later_turns": (sum(t[2] == "warm" for t in later) / len(later)
                                       if later else float("nan"))}


async def run_conversation(case: str, clients_list: list[int],
                           seconds: float) -> dict[str, Any]:
    """Both variants per client count, fresh nodes (cold caches) and gateway each run."""
    factors = CONV_CASES[case]
    out: dict[str, Any] = {}
    for clients in clients_list:
        row: dict[str, Any] = {}
        for variant in ("oracle", "serve"):
            procs: list[subprocess.Popen[bytes]] = []
            try:
                node_urls: dict[str, str] = {}
                for node_id, factor in zip(CONV_NODES, factors, strict=True):
                    port = free_port()
                    procs.append(start(conv_node_command(node_id, port, factor)))
                    node_urls[node_id] = f"http://127.0.0.1:{port}"
                for url in node_urls.values():
                    await wait_up(url + "/v1/models")
                choosers: list[Oracle | Gatewayed]
                if variant == "oracle":
                    oracle = Oracle(list(node_urls.values()),
                                    [CONV_PREFILL_TPS * f for f in factors])
                    choosers = [oracle] * clients
                else:
                    mesh = Case("conversation", "", tuple(
                        batching(n, CONV_TPS * f, CONV_SLOTS, 0.02)
                        for n, f in zip(CONV_NODES, factors, strict=True)))
                    url = await gateway(mesh, node_urls, "thompson", procs, slots=True)
                    choosers = [Gatewayed(url)] * clients
                row[variant] = await conv_load(choosers, seconds)
                by_url = {url: f"{n}" for n, url in node_urls.items()}
                row[variant]["per_node"] = {by_url.get(k, k): v for k, v in
                                            row[variant]["per_node"].items()}
            finally:
                for proc in procs:
                    stop(proc)
        row["ttft_over_oracle"] = row["serve"]["mean_ttft_s"] / row["oracle"]["mean_ttft_s"]
        row["goal_met"] = row["ttft_over_oracle"] <= CONV_GOAL
        out[str(clients)] = row
        serve, best = row["serve"], row["oracle"]
        print(f"conversation {case:6s} clients {clients:2d}: mean TTFT serve "
              f"{serve['mean_ttft_s']:.3f} s (p95 {serve['p95_ttft_s']:.2f}) vs best "
              f"warm-or-cold {best['mean_ttft_s']:.3f} s (p95 {best['p95_ttft_s']:.2f}) = "
              f"{row['ttft_over_oracle']:.2f}x (goal <= {CONV_GOAL}x); warm later turns "
              f"{serve['warm_share_later_turns']:.0%} vs {best['warm_share_later_turns']:.0%};"
              f" turns {serve['turns']} / {best['turns']}, failures {serve['failures']} / "
              f"{best['failures']}\n    per node (turns, cold, mean TTFT s): serve "
              f"{_places(serve)}; best {_places(best)}", flush=True)
    return out


# -- the slot-limited mesh and several trackers (issue 31) -------------------------------------
# A fast node serving 2 at once beside one serving 8 at a quarter of its speed (the
# simulator's scenario 20, scaled to 400 / 100 tok/s: the emulator sleeps per token), 6
# closed-loop clients of MESH_TOKENS-token answers. The yardstick is the best fixed split
# (2 clients on the fast node, 4 on the other) calling the nodes directly; then one gateway
# for all six, and three gossiping gateways with 2 / 2 / 2 and 4 / 1 / 1 clients, each
# seeing its own requests and the nodes' x-meshroute-load on every answer.
MESH_NODES = (batching("gpu", 400.0, 2, 0.0), batching("cpu", 100.0, 8, 0.0))
MESH_CLIENTS = 6
MESH_TOKENS = 64
MESH_LAYOUTS: dict[str, tuple[int, ...]] = {"one": (6,), "2/2/2": (2, 2, 2), "4/1/1": (4, 1, 1)}


async def run_mesh(seconds: float, layouts: list[str],
                   before: Path | None = None) -> dict[str, Any]:
    """Every layout of trackers on fresh nodes and gateways, after the best fixed split;
    with `before` (an older checkout), each layout's gateways from it too, interleaved."""
    case = Case("slots", "2 slots at 400 tok/s beside 8 at 100", MESH_NODES)
    out: dict[str, Any] = {}
    variants = [v for layout in layouts
                for v in (layout, *((f"{layout} before",) if before else ()))]
    for variant in ("best", *variants):
        procs: list[subprocess.Popen[bytes]] = []
        try:
            node_urls = {}
            for spec in case.nodes:
                port = free_port()
                procs.append(start(node_command(spec, port, MESH_TOKENS)))
                node_urls[spec.node_id] = f"http://127.0.0.1:{port}"
            for url in node_urls.values():
                await wait_up(url + "/v1/models")
            if variant == "best":
                urls = direct_urls(case, node_urls, MESH_CLIENTS)
            else:
                layout = MESH_LAYOUTS[variant.removesuffix(" before")]
                tree = before if variant.endswith(" before") else None
                gateways = await gossiping_gateways(case, node_urls, len(layout), procs, tree)
                urls = [g for g, k in zip(gateways, layout, strict=True) for _ in range(k)]
            out[variant] = await load(urls, seconds, MESH_TOKENS)
        finally:
            for proc in procs:
                stop(proc)
    best = out["best"]["tokens_per_s"]
    for variant in variants:
        out[variant]["fraction_of_best"] = out[variant]["tokens_per_s"] / best
        print(f"slots {variant:13s}: {out[variant]['fraction_of_best']:.3f} of the best fixed "
              f"split ({best:.0f} tok/s)", flush=True)
    return out


async def gossiping_gateways(case: Case, node_urls: dict[str, str], count: int,
                             procs: list[subprocess.Popen[bytes]],
                             tree: Path | None = None) -> list[str]:
    """`count` gateways over the nodes (their slots announced), gossiping over loopback."""
    gossip = [f"127.0.0.1:{free_port()}" for _ in range(count)]
    urls = []
    for k in range(count):
        extra = ["--tracker-id", f"bench-{k}", "--seed", str(k + 1)]
        if count > 1:
            extra += ["--gossip-listen", gossip[k]]
            for j in range(count):
                if j != k:
                    extra += ["--gossip-peer", gossip[j]]
        urls.append(await gateway(case, node_urls, "thompson", procs, slots=True, extra=extra,
                                  tree=tree))
    return urls


def _places(run: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v['turns']}/{v['cold']}/{v['mean_ttft_s']:.2f}"
                     for k, v in run["per_node"].items())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="per run (default 20)")
    parser.add_argument("--clients", default="1,4,16", help="client counts (default 1,4,16)")
    parser.add_argument("--case", action="append", help="only this case (repeatable)")
    parser.add_argument("--json", type=Path, default=RESULTS, help="write the report here")
    parser.add_argument("--trace", type=Path, metavar="DIR",
                        help="log every sample the gateway's policy takes (JSON lines per run)")
    parser.add_argument("--policy", action="append", choices=("thompson", "epsilon-greedy"),
                        help="only this policy (repeatable; default both)")
    parser.add_argument("--conversation", action="store_true",
                        help="the conversation case (prefix caches, time to first token)")
    parser.add_argument("--engine", choices=("llama-server",),
                        help="conversations on real engines (meshroute, pinned, round-robin)")
    parser.add_argument("--runs", type=int, default=5, help="--engine runs (default 5)")
    parser.add_argument("--mesh", action="store_true",
                        help="the slot-limited mesh, one gateway and three (issue 31)")
    parser.add_argument("--layout", action="append", choices=tuple(MESH_LAYOUTS),
                        help="with --mesh: only this layout of trackers (repeatable)")
    parser.add_argument("--before", type=Path, metavar="DIR",
                        help="with --mesh: also run each layout's gateways from this older "
                             "checkout (e.g. `git archive COMMIT | tar -x -C DIR`)")
    args = parser.parse_args(argv)
    if args.engine is not None:
        sys.path.insert(0, str(ROOT))  # the engine harness lives in tests/engines/
        from benchmarks._engine_conv import run_engine
        path = args.json if args.json != RESULTS else RESULTS.with_name("realtime_engine.json")
        run_engine(args.runs, path, args.trace)
        return 0
    if args.mesh:
        path = args.json if args.json != RESULTS else RESULTS.with_name("realtime_mesh.json")
        mesh = {"seconds": args.seconds, "tokens": MESH_TOKENS, "load_average": os.getloadavg(),
                "runs": asyncio.run(run_mesh(args.seconds, args.layout or list(MESH_LAYOUTS),
                                             args.before)),
                "load_average_after": os.getloadavg()}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(mesh, indent=2) + "\n")
        return 0
    if args.conversation:
        clients = [int(c) for c in (args.clients if args.clients != "1,4,16"
                                    else "4,16").split(",")]
        path = args.json if args.json != RESULTS else RESULTS.with_name(
            "realtime_conversation.json")
        names = [c for c in CONV_CASES if not args.case or c in args.case]
        conv = {"seconds": args.seconds, "tokens": TOKENS, "load_average": os.getloadavg(),
                "cases": {name: asyncio.run(run_conversation(name, clients, args.seconds))
                          for name in names},
                "load_average_after": os.getloadavg()}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(conv, indent=2) + "\n")
        return 0
    clients = [int(c) for c in args.clients.split(",")]
    cases = [c for c in CASES if not args.case or c.name in args.case]
    if args.trace is not None:
        args.trace.mkdir(parents=True, exist_ok=True)
    policies = tuple(args.policy or POLICIES)
    report = {"seconds": args.seconds, "tokens": TOKENS, "cases": {},
              "load_average": os.getloadavg()}
    for case in cases:
        report["cases"][case.name] = {"title": case.title,
                                      "runs": asyncio.run(run_case(
                                          case, clients, args.seconds, policies, args.trace))}
    report["load_average_after"] = os.getloadavg()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
