"""What tracing costs per chat request, in-process (bench_overhead's gateway and clock):

  python benchmarks/bench_traces.py [--requests 2000] [--rounds 5] [--clock cpu|wall]

- gateway (forward): `meshroute serve`'s app, no --otlp-endpoint;
- traced: the same with --otlp-endpoint to an OTLP/HTTP receiver on 127.0.0.1 (a process of its
  own that reads and acknowledges each export), every span flushed inside the measured time;
- traced, collector down: --otlp-endpoint to a port nothing listens on (exports fail, counted).
The CPU clock is this whole process's: the batch exporter's thread counts too.
Rounds interleave the variants; medians are reported, and each traced variant's ratio to the
untraced gateway measured in the same round.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks._apps import chat  # noqa: E402
from benchmarks.bench_overhead import CLOCKS, HEAD, per_request_us  # noqa: E402
from meshroute_middleware.app.gateway import build_gateway  # noqa: E402
from meshroute_middleware.app.settings import ServeSettings  # noqa: E402
from meshroute_middleware.core import parse_node  # noqa: E402
from meshroute_middleware.forwarding.memory import ASGIForwarder  # noqa: E402

RECEIVER = """
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Ack(BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        self.send_response(200)
        self.send_header("content-type", "application/x-protobuf")
        self.send_header("content-length", "0")
        self.end_headers()
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), Ack)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gateway(forwarder: ASGIForwarder, endpoint: str | None
            ) -> tuple[Any, Callable[[], Awaitable[Any]]]:
    """The gateway's app, and what exports its ended spans (nothing when untraced)."""
    gw = build_gateway(replace(ServeSettings(), mdns=False, seed=1, otlp_endpoint=endpoint),
                       forwarder=forwarder)
    gw.mesh.upsert(parse_node({"node_id": "b", "model": "m", "start": 0, "end": 39,
                               "layers": 40, "url": HEAD}))
    tracing = getattr(gw.app, "tracing", None)

    async def flush() -> None:
        if tracing is not None:
            tracing.flush()
    return gw.app, flush


async def measure(requests: int, rounds: int, clock: str) -> tuple[dict[str, float],
                                                                   dict[str, float]]:
    receiver = subprocess.Popen([sys.executable, "-c", RECEIVER], stdout=subprocess.PIPE,
                                text=True)
    assert receiver.stdout is not None
    port = int(receiver.stdout.readline())
    forwarder = ASGIForwarder({HEAD: chat})
    apps = {"gateway (forward)": gateway(forwarder, None),
            "traced": gateway(forwarder, f"http://127.0.0.1:{port}"),
            "traced, collector down": gateway(forwarder, f"http://127.0.0.1:{_free_port()}")}
    for app, finish in apps.values():
        await per_request_us(app, 200, finish=finish)  # warm up
    samples: dict[str, list[float]] = {name: [] for name in apps}
    names = list(apps)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            app, finish = apps[name]
            print(f"\rround {r + 1}/{rounds}: {name:<24}", end="", file=sys.stderr, flush=True)
            samples[name].append(await per_request_us(app, requests, CLOCKS[clock], finish))
    print(file=sys.stderr)
    receiver.kill()
    receiver.wait()
    base = samples["gateway (forward)"]
    ratios = {name: statistics.median(t / b for t, b in zip(samples[name], base, strict=True))
              for name in names[1:]}
    return {name: statistics.median(v) for name, v in samples.items()}, ratios


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="cpu")
    args = parser.parse_args()
    res, ratios = asyncio.run(measure(args.requests, args.rounds, args.clock))
    print(f"\n| in-process ({args.clock} clock) | µs per request | × untraced |\n|---|---:|---:|")
    for name, us in res.items():
        print(f"| {name} | {us:.1f} | {ratios.get(name, 1.0):.2f}× |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
