"""One command to see provider routes work, on loopback only:

    python examples/providers/try.py

starts two fake OpenAI-compatible providers on 127.0.0.1:9101 ("fastco") and :9102
("slowco"), runs `meshroute serve --config examples/providers/meshroute.toml` against them
with made-up keys in the environment, and sends a few requests: round-robin over fastco's
two keys, a 429 that cools a key and falls over, and the chain the gateway would try now.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

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
        threading.Thread(target=self.server.run, daemon=True).start()
        while not self.server.started:
            time.sleep(0.01)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    fastco, slowco = Provider("fastco", 9101), Provider("slowco", 9102)
    fastco.start()
    slowco.start()
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    gateway = subprocess.Popen(
        [sys.executable, "-m", "meshroute_middleware.app.cli", "serve", "--config",
         str(HERE / "meshroute.toml"), "--port", str(port), "--no-mdns",
         "--state-file", ":memory:", "--log-level", "warning"],
        env={**os.environ, **KEYS})
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=1)
                break
            except httpx.TransportError:
                if gateway.poll() is not None or time.monotonic() > deadline:
                    print("meshroute serve did not start", file=sys.stderr)
                    return 1
                time.sleep(0.1)

        def ask(model: str, note: str) -> dict[str, Any]:
            r = httpx.post(f"{url}/v1/chat/completions", timeout=30,
                           json={"model": model, "messages": [{"role": "user",
                                                               "content": "hi"}]})
            print(f"{note:<37} {model:<18} -> {r.status_code} "
                  f"route={r.headers.get('x-meshroute-route')} "
                  f"tried={r.headers.get('x-meshroute-tried')}")
            return dict(r.json())

        ask("fastco/big-model", "a provider model by name")
        ask("fastco/big-model", "again: the next key (round-robin)")
        ask("auto", "auto: the 'coding' profile's chain")
        fastco.rate_limit_next = 1
        ask("fastco/big-model", "a 429 cools a key, the other answers")
        fastco.rate_limit_next = 2
        ask("auto:smart", "auto:smart with fastco limited")
        chain = httpx.get(f"{url}/v1/routing/chain", params={"model": "fastco/big-model"})
        for key in chain.json()["chain"][0]["keys"]:
            until = key["until"]
            print(f"  fastco/big-model#{key['key']}: {key['state']}"
                  + (f" for {until - time.time():.0f} s" if until else ""))
        print("\n".join(fastco.log + slowco.log))
        return 0
    finally:
        gateway.terminate()
        gateway.wait(10)


if __name__ == "__main__":
    sys.exit(main())
