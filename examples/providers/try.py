"""One command to see provider routes work, on loopback only:

    .venv/bin/python examples/providers/try.py

starts two fake OpenAI-compatible providers on 127.0.0.1:9101 ("fastco") and :9102
("slowco"), runs `meshroute serve --config examples/providers/meshroute.toml` against them
with made-up keys in the environment, and sends a few requests: round-robin over fastco's
two keys, a 429 that cools a key and falls over, and the chain the gateway would try now.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from _procs import MESHROUTE, free_port, http, running

HERE = Path(__file__).resolve().parent
KEYS = {"FASTCO_KEY_A": "demo-fastco-key-A", "FASTCO_KEY_B": "demo-fastco-key-B",
        "SLOWCO_KEY": "demo-slowco-key"}


class Provider:
    """Answers chat completions; `rate_limit_next` makes the next answer a 429."""

    def __init__(self, name: str, port: int) -> None:
        self.name, self.port, self.rate_limit_next = name, port, 0
        self.log: list[str] = []
        app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                                    log_level="warning"))

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        key = request.headers.get("authorization", "")[7:]
        named = next((name for name, value in KEYS.items() if value == key), "an unknown key")
        self.log.append(f"{self.name} got model={body['model']!r} with ${named}")
        if self.rate_limit_next:
            self.rate_limit_next -= 1
            return JSONResponse({"error": {"message": "slow down", "type": "rate_limit",
                                           "code": "429"}}, 429, {"Retry-After": "30"})
        return JSONResponse({
            "id": "x", "object": "chat.completion", "created": 0, "model": body["model"],
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": f"hello from {self.name}"}}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8}})

    def start(self) -> None:
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        while not self.server.started:
            time.sleep(0.01)

    def stop(self) -> None:
        """Shut the server down and wait for it (a daemon thread left running while the
        interpreter exits can end the process with a non-zero status)."""
        self.server.should_exit = True
        self.thread.join(timeout=10)


def main() -> int:
    fastco, slowco = Provider("fastco", 9101), Provider("slowco", 9102)
    fastco.start()
    slowco.start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    os.environ.update(KEYS)  # made-up keys, read by the gateway as the config says
    with running(*MESHROUTE, "serve", "--config", str(HERE / "meshroute.toml"),
                 "--port", str(port), "--no-mdns", "--state-file", ":memory:",
                 "--log-level", "warning", ready_url=f"{url}/healthz"):

        def ask(model: str, note: str) -> None:
            status, headers, _ = http("POST", f"{url}/v1/chat/completions",
                                      {"model": model,
                                       "messages": [{"role": "user", "content": "hi"}]})
            header = {name.lower(): value for name, value in headers.items()}
            print(f"{note:<37} {model:<18} -> {status} "
                  f"route={header.get('x-meshroute-route')} "
                  f"tried={header.get('x-meshroute-tried')}")

        ask("fastco/big-model", "a provider model by name")
        ask("fastco/big-model", "again: the next key (round-robin)")
        ask("auto", "auto: the 'coding' profile's chain")
        fastco.rate_limit_next = 1
        ask("fastco/big-model", "a 429 cools a key, the other answers")
        fastco.rate_limit_next = 2
        ask("auto:smart", "auto:smart with fastco limited")
        query = urllib.parse.urlencode({"model": "fastco/big-model"})
        _, _, chain = http("GET", f"{url}/v1/routing/chain?{query}")
        for key in chain["chain"][0]["keys"]:
            until = key["until"]
            print(f"  fastco/big-model#{key['key']}: {key['state']}"
                  + (f" for {until - time.time():.0f} s" if until else ""))
        print("\n".join(fastco.log + slowco.log))
    fastco.stop()
    slowco.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
