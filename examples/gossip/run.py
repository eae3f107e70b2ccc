"""Two trackers gossiping: one measures, the other learns it without serving a request.

Starts (all on 127.0.0.1): two OpenAI-compatible chat servers of different speed (the node
agent example's `stub_server.py`), tracker A and tracker B, each told of the other with
`--gossip-listen` / `--gossip-peer`, and registers both nodes with both trackers. Chat traffic
goes through A only; then B's /v1/routing shows A's measurements (samples from one origin
tracker, merged by decayed mass), while B itself has served nothing.

    .venv/bin/python examples/gossip/run.py
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _procs import MESHROUTE, free_port, http, running, wait_until

STUB = Path(__file__).resolve().parent.parent / "node_agent" / "stub_server.py"
LOOPBACK = "127.0.0.1"
MODEL = "tiny"
REQUESTS = 12


def main() -> int:
    with contextlib.ExitStack() as stack:
        nodes = []
        for node_id, tps in (("fast", 300.0), ("slow", 80.0)):
            url = f"http://{LOOPBACK}:{free_port()}"
            stack.enter_context(running(sys.executable, str(STUB), "--port",
                                        url.rsplit(":", 1)[1], "--model", MODEL, "--tps",
                                        str(tps), ready_url=url + "/v1/models"))
            nodes.append({"node_id": node_id, "model": MODEL, "start": 0, "end": 23,
                          "layers": 24, "url": url, "tps": 100})
        gossip = {"a": f"{LOOPBACK}:{free_port()}", "b": f"{LOOPBACK}:{free_port()}"}
        trackers = {}
        for me, peer in (("a", "b"), ("b", "a")):
            port = free_port()
            trackers[me] = f"http://{LOOPBACK}:{port}"
            stack.enter_context(running(
                *MESHROUTE, "serve", "--host", LOOPBACK, "--port", str(port), "--no-mdns",
                "--tracker-id", me, "--gossip-listen", gossip[me], "--gossip-peer",
                gossip[peer], "--log-level", "warning",
                ready_url=trackers[me] + "/v1/routing"))
        for url in trackers.values():
            for node in nodes:
                assert http("POST", url + "/v1/nodes", node)[0] in (200, 201)
        for _ in range(REQUESTS):
            status, _, _ = http("POST", trackers["a"] + "/v1/chat/completions", {
                "model": MODEL, "max_tokens": 16, "messages": [{"role": "user",
                                                                 "content": "hi"}]})
            assert status == 200, status
        print(f"tracker a served {REQUESTS} requests; tracker b served none")
        rows = wait_until(lambda: _learned(trackers["b"]),
                          "tracker b to receive tracker a's statistics")
        print("tracker b's routing table, learned through gossip:")
        for row in rows:
            tps = "-" if row["tps"] is None else f"{row['tps']:.1f}"
            print(f"  {row['signature']:<20} {tps:>7} tok/s  samples {row['samples']:>3}  "
                  f"from {row['origins']} tracker(s)")
    return 0


def _learned(tracker: str) -> list[dict[str, Any]] | None:
    """The tracker's candidate rows once it holds measurements (from gossip: it served
    nothing itself) of every route the other tracker used."""
    rows = http("GET", f"{tracker}/v1/routing?model={MODEL}")[2]["models"][MODEL]["candidates"]
    if sum(r["samples"] for r in rows) >= REQUESTS and all(r["origins"] for r in rows
                                                           if r["samples"]):
        return list(rows)
    return None


if __name__ == "__main__":
    sys.exit(main())
