"""meshroute's own CPU per chat request, in-process (no sockets, no HTTP server):

  python benchmarks/bench_overhead.py [--requests 5000] [--rounds 5] [--clock cpu|wall]
      [--gc default|settled]

- middleware: the instant chat app alone vs behind MeshRouteMiddleware (annotate mode);
- gateway: a bare pass-through vs the `meshroute serve` app, both forwarding to the same
  in-process chat app through the same in-memory forwarder (meshroute_middleware.forwarding.memory).
The difference is what routing, measuring, recording, events and metrics cost per request.
- keyed: the same gateway with one `[[clients]]` client and its key on every request, once with
  no limits and once with rpm/tpm/daily_tokens/monthly_usd set high enough never to refuse,
  in this process's memory (`--state-file :memory:`) and in a state file (the default of a
  gateway with provider tables, and what `--workers N` share): what a client key costs, as
  a ratio to the unkeyed gateway (with the same state file, or none).
Rounds interleave the variants (each round starting at the next one); medians are
reported. Each keyed ratio is given twice: the median of the rounds' ratios (keyed over
unkeyed measured in the same round), and the ratio of the fastest rounds (other work on the
machine only adds time, so the fastest round of each is the least disturbed). The clock is
this process's CPU time by default (`--clock wall`: elapsed time): on a machine other work
loads, elapsed time counts the other work's share of the CPU too. A keyed gateway's usage
written behind (chat/ledger.py) is flushed inside the measured time. `--gc settled` sets the
collector up as `meshroute serve --gc python` does once it has started (app/run.py
`settle_heap`: the start-up heap frozen, full collections rarer); the default leaves
CPython's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._apps import chat, wrapped  # noqa: E402
from meshroute_middleware.app.gateway import build_gateway  # noqa: E402
from meshroute_middleware.app.run import settle_heap  # noqa: E402
from meshroute_middleware.app.settings import ServeSettings  # noqa: E402
from meshroute_middleware.core import parse_node  # noqa: E402
from meshroute_middleware.core.clients import ClientTable, key_digest  # noqa: E402
from meshroute_middleware.forwarding.memory import ASGIForwarder  # noqa: E402
from meshroute_middleware.http.request import replay  # noqa: E402

BODY = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).encode()
HEAD = "http://127.0.0.1:1"
SCOPE = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
         "headers": [(b"host", b"localhost"), (b"content-type", b"application/json"),
                     (b"content-length", str(len(BODY)).encode())],
         "query_string": b"", "http_version": "1.1", "scheme": "http", "root_path": "",
         "server": ("127.0.0.1", 80), "client": ("127.0.0.1", 1), "state": {}}
KEY = "mr-bench-0123456789abcdef"
KEYED_SCOPE = {**SCOPE, "headers": [*SCOPE["headers"],
                                    (b"authorization", f"Bearer {KEY}".encode())]}


class PassThrough:
    """Read the body, forward it, relay the answer: nothing else."""

    def __init__(self, forwarder: ASGIForwarder) -> None:
        self.forwarder = forwarder

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        upstream = await self.forwarder.open(HEAD + scope["path"], body,
                                             [(b"content-type", b"application/json")])
        await send({"type": "http.response.start", "status": upstream.status,
                    "headers": upstream.headers})
        async for chunk in upstream.chunks():
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})
        upstream.close()


class Keyed:
    """The request presents the bench client's key."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await self.app({**scope, "headers": KEYED_SCOPE["headers"]}, receive, send)


CLOCKS: dict[str, Callable[[], float]] = {"cpu": time.process_time, "wall": time.perf_counter}


async def _nothing() -> None:
    pass


def gateway_app(forwarder: ASGIForwarder, clients: tuple[ClientTable, ...] = ()) -> Any:
    return gateway_and_flush(forwarder, clients)[0]


def gateway_and_flush(forwarder: ASGIForwarder, clients: tuple[ClientTable, ...] = (),
                      state_file: str | None = None
                      ) -> tuple[Any, Callable[[], Awaitable[Any]]]:
    """The gateway's app, and what writes its usage queued behind the answers. `state_file`:
    clients' limits in that state file (what a gateway with provider tables uses by
    default), else in this process's memory."""
    gateway = build_gateway(replace(ServeSettings(), mdns=False, seed=1, clients=clients,
                                    state_file=state_file), forwarder=forwarder)
    gateway.mesh.upsert(parse_node({"node_id": "b", "model": "m", "start": 0, "end": 39,
                                    "layers": 40, "url": HEAD}))
    ledger = getattr(gateway.spend, "ledger", None)  # an older checkout writes at once
    return gateway.app, (_nothing if ledger is None else ledger.flush)


async def per_request_us(app: Any, n: int, clock: Callable[[], float] = time.perf_counter,
                         finish: Callable[[], Awaitable[Any]] = _nothing) -> float:
    """Mean time (`clock`) of n sequential requests and `finish()`, µs."""
    refused = 0

    async def send(message: Any) -> None:
        nonlocal refused
        if message["type"] == "http.response.start" and message["status"] != 200:
            refused += 1

    async def never() -> Any:  # the client never leaves
        await asyncio.sleep(3600)

    start = clock()
    for _ in range(n):
        await app({**SCOPE, "state": {}}, replay(BODY, never), send)  # state: per request
    await finish()
    took = (clock() - start) / n * 1e6
    if refused:  # an error answer is cheaper than a routed one: it would flatter the figure
        raise SystemExit(f"{refused} of {n} requests were not answered 200")
    return took


# each keyed variant and the unkeyed gateway it is compared with
KEYED = {"gateway keyed (no limits)": "gateway (forward)",
         "gateway keyed (limits)": "gateway (forward)",
         "gateway keyed (limits, state file)": "gateway (forward, state file)"}


async def measure(requests: int, rounds: int, clock: str = "cpu", gc: str = "default"
                  ) -> tuple[dict[str, float], dict[str, float]]:
    """Median µs per request of each variant, and the median over rounds of each keyed
    variant's ratio to the unkeyed gateway measured in the same round (a round's ratio
    cancels the load that drifts between rounds)."""
    forwarder = ASGIForwarder({HEAD: chat})
    digest = "sha256:" + key_digest(KEY).hex()
    plain = ClientTable("bench", digest)
    limited = ClientTable("bench", digest, rpm=10**9, tpm=10**12, daily_tokens=10**12,
                          monthly_usd=1e12)
    unkeyed, flush_unkeyed = gateway_and_flush(forwarder)
    keyed, flush_keyed = gateway_and_flush(forwarder, (plain,))
    limits, flush_limits = gateway_and_flush(forwarder, (limited,))
    state_dir = tempfile.TemporaryDirectory(prefix="bench-overhead-")
    unfiled, flush_unfiled = gateway_and_flush(forwarder, (),
                                               str(Path(state_dir.name) / "plain.db"))
    filed, flush_filed = gateway_and_flush(forwarder, (limited,),
                                           str(Path(state_dir.name) / "state.db"))
    apps: dict[str, tuple[Any, Callable[[], Awaitable[Any]]]] = {
        "bare app": (chat, _nothing), "middleware (annotate)": (wrapped(), _nothing),
        "pass-through": (PassThrough(forwarder), _nothing),
        "gateway (forward)": (unkeyed, flush_unkeyed),
        "gateway keyed (no limits)": (Keyed(keyed), flush_keyed),
        "gateway keyed (limits)": (Keyed(limits), flush_limits),
        "gateway (forward, state file)": (unfiled, flush_unfiled),
        "gateway keyed (limits, state file)": (Keyed(filed), flush_filed)}
    for app, finish in apps.values():
        await per_request_us(app, 500, finish=finish)  # warm up: caches, first enumeration
    if gc == "settled":
        settle_heap()
    samples: dict[str, list[float]] = {name: [] for name in apps}
    names = list(apps)
    for r in range(rounds):  # each round starts one variant later: no variant always last
        for name in names[r % len(names):] + names[:r % len(names)]:
            app, finish = apps[name]
            print(f"\rround {r + 1}/{rounds}: {name:<24}", end="", file=sys.stderr, flush=True)
            samples[name].append(await per_request_us(app, requests, CLOCKS[clock], finish))
    print(file=sys.stderr)
    ratios = {}
    for name, base in KEYED.items():
        unkeyed = samples[base]
        ratios[f"{name} / {base}, median of rounds"] = statistics.median(
            k / u for k, u in zip(samples[name], unkeyed, strict=True))
        ratios[f"{name} / {base}, fastest rounds"] = min(samples[name]) / min(unkeyed)
    return {name: statistics.median(v) for name, v in samples.items()}, ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu",
                        help="cpu: this process's CPU time (default; a loaded machine's other "
                        "work does not count); wall: elapsed time")
    parser.add_argument("--gc", choices=("default", "settled"), default="default",
                        help="settled: the collector as `meshroute serve --gc python` sets "
                        "it (start-up heap frozen, full collections rarer)")
    parser.add_argument("--stepped-timings", action="store_true",
                        help="time.perf_counter steps 1 ms per call, as in the instruction "
                        "counts (forward_instructions.fixed_clocks): the upstream speeds the "
                        "policy learns from follow the code run, not the machine")
    parser.add_argument("--json", default=str(ROOT / "benchmarks/results/overhead.json"))
    args = parser.parse_args()
    if args.stepped_timings:
        from benchmarks.forward_instructions import fixed_clocks
        fixed_clocks()
    res, keyed = asyncio.run(measure(args.requests, args.rounds, args.clock, args.gc))
    what = "CPU time" if args.clock == "cpu" else "wall time"
    print(f"\nclock: {what} of this process (--clock {args.clock}); --gc {args.gc}")
    print(f"\n| in-process | µs per request ({what}) |\n|---|---:|")
    for name, us in res.items():
        print(f"| {name} | {us:.1f} |")
    mw = res["middleware (annotate)"] - res["bare app"]
    gw = res["gateway (forward)"] - res["pass-through"]
    print(f"| middleware's own cost | {mw:.1f} |\n| gateway's own cost | {gw:.1f} |")
    for name, ratio in keyed.items():
        print(f"| {name} | {ratio:.2f}× |")
    Path(args.json).write_text(json.dumps({"clock": args.clock, "gc": args.gc,
                                           "us_per_request": res, "middleware_cost_us": mw,
                                           "gateway_cost_us": gw, "keyed_ratio": keyed},
                                          indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
