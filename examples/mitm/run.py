"""meshroute inside mitmproxy: chat requests passing through the proxy are routed and learned.

Run it with the Python of a venv that has mitmproxy (`scripts/mitm-venv` builds .venv-mitm):

    .venv-mitm/bin/python examples/mitm/run.py

Starts (all on 127.0.0.1) two OpenAI-compatible chat servers serving model "tiny" (the node
agent example's stub server, one fast, one slow), writes them to a nodes file, runs
`mitmdump -s <the meshroute addon>` with that file, and sends chats through mitmproxy as an
HTTP proxy. The addon chooses a route for each, sends the request to its head, measures the
answer and serves what it learned at its side server's /v1/routing.
"""

from __future__ import annotations

import contextlib
import json
import sys
import tempfile
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _procs import free_port, http, running, wait_until

import meshroute_middleware.app.mitm

HERE = Path(__file__).resolve().parent
STUB = HERE.parent / "node_agent" / "stub_server.py"
ADDON = Path(meshroute_middleware.app.mitm.__file__).parent / "addon.py"
MITMDUMP = str(Path(sys.executable).parent / "mitmdump")
LOOPBACK = "127.0.0.1"
CHATS = 8


def main() -> int:
    proxy_port, side_port = free_port(), free_port()
    side = f"http://{LOOPBACK}:{side_port}"
    with contextlib.ExitStack() as stack:
        nodes = []
        for node_id, tps in (("fast", 300.0), ("slow", 60.0)):
            url = f"http://{LOOPBACK}:{free_port()}"
            stack.enter_context(running(sys.executable, str(STUB), "--port",
                                        url.rsplit(":", 1)[1], "--tps", str(tps),
                                        ready_url=url + "/v1/models"))
            nodes.append({"node_id": node_id, "model": "tiny", "start": 0, "end": 23,
                          "layers": 24, "url": url, "tps": 100})
        nodes_file = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "nodes.json"
        nodes_file.write_text(json.dumps(nodes))
        stack.enter_context(running(
            MITMDUMP, "-q", "-s", str(ADDON), "--listen-host", LOOPBACK, "--listen-port",
            str(proxy_port), "--set", f"meshroute_nodes_file={nodes_file}",
            "--set", f"meshroute_side_port={side_port}", "--set", "meshroute_mdns=false",
            ready_url=side + "/v1/routing"))
        # Any client with mitmproxy as its HTTP proxy; the URL it asks for is the slow node's.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler(
            {"http": f"http://{LOOPBACK}:{proxy_port}"}))
        for i in range(CHATS):
            body = json.dumps({"model": "tiny", "max_tokens": 12, "stream": i % 2 == 1,
                               "messages": [{"role": "user", "content": "hi"}]}).encode()
            request = urllib.request.Request(nodes[1]["url"] + "/v1/chat/completions",
                                             data=body, method="POST",
                                             headers={"content-type": "application/json"})
            with opener.open(request, timeout=30) as resp:
                resp.read()
                print(f"chat {i} (stream={i % 2 == 1}): HTTP {resp.status} via "
                      f"{resp.headers.get('x-meshroute-route')} "
                      f"({resp.headers.get('x-meshroute-mode')})")
        rows = wait_until(lambda: _measured(side), "the addon's measurements")
        print("the addon's routing table (its side server's /v1/routing):")
        for row in rows:
            tps = "-" if row["tps"] is None else f"{row['tps']:.1f}"
            print(f"  {row['signature']:<16} {tps:>7} tok/s  samples {row['samples']}")
    return 0


def _measured(side: str) -> list[dict[str, object]] | None:
    rows = http("GET", side + "/v1/routing?model=tiny")[2]["models"]["tiny"]["candidates"]
    return rows if sum(int(r["samples"]) for r in rows) >= CHATS else None


if __name__ == "__main__":
    sys.exit(main())
