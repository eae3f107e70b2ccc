"""Client keys on loopback, in one command:

    .venv/bin/python examples/providers/try_clients.py

serves `meshroute.toml` with `clients.toml` appended (two clients: `alice-laptop`, whose key
is read from $ALICE_KEY, and `ci`, configured by its sha256 only) against two fake providers
on 127.0.0.1:9101 and :9102, and sends requests with no key, a wrong key and each client's key:
401, 403 outside a client's `models`, 200 inside; then shows that the providers only ever saw
their own keys.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
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
ALICE_KEY = "mr-demo-alice-key-not-a-real-one"  # made up, like the provider keys
CI_KEY = "mr-demo-ci-key-not-a-real-one-0123"  # clients.toml holds only its sha256


class Provider:
    """Answers chat completions; keeps every header it was sent."""

    def __init__(self, name: str, port: int) -> None:
        self.name, self.port, self.headers = name, port, list[dict[str, str]]()
        app = Starlette(routes=[Route("/v1/chat/completions", self.chat, methods=["POST"])])
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port,
                                                    log_level="warning"))

    async def chat(self, request: Request) -> Response:
        self.headers.append(dict(request.headers))
        body = await request.json()
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
    os.environ.update({**KEYS, "ALICE_KEY": ALICE_KEY})
    with tempfile.TemporaryDirectory() as tmp:
        team = Path(tmp) / "team.toml"
        team.write_text((HERE / "meshroute.toml").read_text() + "\n"
                        + (HERE / "clients.toml").read_text())
        with running(*MESHROUTE, "serve", "--config", str(team), "--port", str(port),
                     "--no-mdns", "--state-file", ":memory:", "--log-level", "warning",
                     ready_url=f"{url}/healthz"):

            def ask(who: str, key: str | None, model: str) -> None:
                headers = {} if key is None else {"authorization": f"Bearer {key}"}
                status, got, body = http(
                    "POST", f"{url}/v1/chat/completions",
                    {"model": model, "messages": [{"role": "user", "content": "hi"}]},
                    headers=headers)
                what = (body["error"]["code"] if status != 200
                        else f"route={got.get('x-meshroute-route')}")
                print(f"{who:<22} {model:<20} -> {status} {what}")

            ask("no key", None, "auto")
            ask("a wrong key", "mr-guessed", "auto")
            ask("alice-laptop", ALICE_KEY, "auto")
            ask("alice-laptop", ALICE_KEY, "fastco/big-model")
            ask("alice-laptop", ALICE_KEY, "slowco/small-model")
            ask("ci (sha256: form)", CI_KEY, "auto:coding")
            ask("ci (sha256: form)", CI_KEY, "auto")
    seen = repr(fastco.headers + slowco.headers)
    leaked = [name for name, key in (("alice", ALICE_KEY), ("ci", CI_KEY)) if key in seen]
    print(f"providers got {len(fastco.headers) + len(slowco.headers)} requests, "
          f"client keys among their headers: {', '.join(leaked) or 'none'}")
    fastco.stop()
    slowco.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
