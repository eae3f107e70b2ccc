"""Provider routes with a fallback chain: a tightly rate-limited provider and a second one.

Starts (all on 127.0.0.1) the two OpenAI-compatible "providers" that
`examples/providers/meshroute.toml` names — fastco on port 9101 (rate-limited: 2 chats per
10 s, then 429 with Retry-After) and slowco on 9102 — as the node agent example's stub server,
then `meshroute serve --config examples/providers/meshroute.toml` with the keys in the
environment, sends a few chats for the chain and prints which route served each and the chain's
key states and cooldowns (GET /v1/routing/chain).

    python examples/providers/run.py
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _procs import MESHROUTE, free_port, http, running

HERE = Path(__file__).resolve().parent
STUB = HERE.parent / "node_agent" / "stub_server.py"
LOOPBACK = "127.0.0.1"
PROVIDERS = {"fastco": (9101, "big-model", ["--rate-limit", "2"]),
             "slowco": (9102, "small-model", [])}
KEYS = {"FASTCO_KEY_A": "sk-example-a", "FASTCO_KEY_B": "sk-example-b",
        "SLOWCO_KEY": "sk-example-c"}  # fake keys: the stub servers accept anything
CHATS = 6


def main() -> int:
    os.environ.update(KEYS)
    port = free_port()
    gateway = f"http://{LOOPBACK}:{port}"
    with contextlib.ExitStack() as stack:
        for name, (provider_port, model, extra) in PROVIDERS.items():
            url = f"http://{LOOPBACK}:{provider_port}"
            stack.enter_context(running(sys.executable, str(STUB), "--port",
                                        str(provider_port), "--model", model, *extra,
                                        ready_url=url + "/v1/models"))
            print(f"provider {name}: {url}/v1 ({model}{', rate-limited' if extra else ''})")
        stack.enter_context(running(
            *MESHROUTE, "serve", "--config", str(HERE / "meshroute.toml"), "--host", LOOPBACK,
            "--port", str(port), "--no-mdns", "--log-level", "warning",
            ready_url=gateway + "/v1/routing"))
        for i in range(CHATS):
            status, headers, _ = http("POST", gateway + "/v1/chat/completions", {
                "model": "auto", "max_tokens": 8,
                "messages": [{"role": "user", "content": f"question {i}"}]})
            print(f"chat {i}: HTTP {status} via {headers.get('x-meshroute-route', '-')}"
                  f" (tried {headers.get('x-meshroute-tried', '-')})")
        status, _, chain = http("GET", gateway + "/v1/routing/chain?model=auto")
        print(f"GET /v1/routing/chain?model=auto: HTTP {status}")
        print(chain)
    return 0


if __name__ == "__main__":
    sys.exit(main())
