"""A node agent in front of a real OpenAI-compatible server, found by a tracker over mDNS.

Starts (all on 127.0.0.1, mDNS bound to loopback):
  1. an OpenAI-compatible chat server (`stub_server.py`, or yours with --server-url),
  2. a tracker gateway: `meshroute serve`,
  3. the node agent: `meshroute node --url <the server> --model ... --shard ...`,
then waits until the tracker has discovered the node, sends a chat through the tracker and
prints the answer and the route the tracker learned.

The tracker and the node share a mesh secret made for this run (MESHROUTE_MESH_SECRET):
the tracker takes only records signed with it, so nodes that other programs announce nearby
(another example, the demo, a real mesh on the same interface) never join this one.

    .venv/bin/python examples/node_agent/run.py
    .venv/bin/python examples/node_agent/run.py --server-url http://127.0.0.1:8080 --model smollm2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import secrets
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _procs import MESHROUTE, free_port, http, running, wait_until

HERE = Path(__file__).resolve().parent
LOOPBACK = "127.0.0.1"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server-url", help="an OpenAI-compatible server already running")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--layers", type=int, default=24)
    args = parser.parse_args()
    tracker = f"http://{LOOPBACK}:{free_port()}"
    # this run's own mesh: the children inherit the secret (kept off their command lines)
    os.environ["MESHROUTE_MESH_SECRET"] = secrets.token_hex(16)
    node_id = f"stub-node-{secrets.token_hex(3)}"  # a name nobody else announces
    with contextlib.ExitStack() as stack:
        server = args.server_url
        if server is None:
            port = free_port()
            server = f"http://{LOOPBACK}:{port}"
            stack.enter_context(running(
                sys.executable, str(HERE / "stub_server.py"), "--port", str(port),
                "--model", args.model, ready_url=server + "/v1/models"))
        stack.enter_context(running(
            *MESHROUTE, "serve", "--host", LOOPBACK, "--port", tracker.rsplit(":", 1)[1],
            "--mdns-interfaces", LOOPBACK, "--log-level", "warning",
            ready_url=tracker + "/v1/routing"))
        stack.enter_context(running(
            *MESHROUTE, "node", "--model", args.model, "--shard", f"0-{args.layers - 1}",
            "--layers", str(args.layers), "--url", server, "--tps", "50",
            "--node-id", node_id, "--mdns-interfaces", LOOPBACK))
        nodes = wait_until(lambda: [n for n in http("GET", tracker + "/v1/nodes")[2]["nodes"]
                                    if n["node_id"] == node_id],
                           "the tracker to discover the node over mDNS")
        print(f"tracker discovered: {[n['node_id'] for n in nodes]} -> {nodes[0]['url']}")
        for stream in (False, True):
            status, headers, body = _chat(tracker, args.model, stream)
            print(f"chat (stream={stream}): HTTP {status} via {headers['x-meshroute-route']}")
        print(f"answer: {body}")
        row = http("GET", f"{tracker}/v1/routing?model={args.model}")[2][
            "models"][args.model]["candidates"][0]
        print(f"learned: {row['signature']} {row['tps']:.1f} tok/s after {row['samples']} "
              "samples")
    return 0


def _chat(tracker: str, model: str, stream: bool) -> tuple[int, dict[str, str], str]:
    import urllib.request

    body = {"model": model, "max_tokens": 12, "stream": stream,
            "messages": [{"role": "user", "content": "hello"}]}
    if not stream:
        status, headers, answer = http("POST", tracker + "/v1/chat/completions", body)
        return status, headers, answer["choices"][0]["message"]["content"]
    import json

    request = urllib.request.Request(tracker + "/v1/chat/completions",
                                     data=json.dumps(body).encode(), method="POST",
                                     headers={"content-type": "application/json"})
    text = []
    with urllib.request.urlopen(request, timeout=30) as resp:
        for line in resp:
            if line.startswith(b"data: {"):
                text += [c["delta"].get("content", "") for c in json.loads(line[6:])["choices"]]
        return resp.status, dict(resp.headers), "".join(text)


if __name__ == "__main__":
    sys.exit(main())
