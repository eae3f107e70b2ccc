"""Helpers of the HTTP-edge attack tests (test_edge_*): a real gateway served the way
`meshroute serve` serves it (uvicorn + app.edge's protocol), raw TCP nodes that misbehave
byte by byte, and raw client sockets."""

from __future__ import annotations

import contextlib
import json
import socket
import socketserver
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import httpx
import uvicorn

from meshroute_middleware.app.gateway import Gateway, build_gateway
from meshroute_middleware.app.run import server_config
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig

from ..upstream import free_port


def _server_config(gateway: Gateway, port: int) -> uvicorn.Config:
    """`meshroute serve`'s uvicorn configuration (app.run.server_config)."""
    return server_config(gateway, port)


class EdgeGateway:
    """A gateway on a loopback port, served with `server_config` (the edge's limits)."""

    def __init__(self, **settings: Any) -> None:
        base = ServeSettings(mdns=False, seed=3, router=RouterConfig(explore_share=0.0),
                             first_byte_timeout_s=5.0, connect_timeout_s=2.0,
                             log_level="warning")
        self.port = free_port()  # known to the gateway: it refuses nodes pointing at itself
        settings = {"port": self.port, **settings}
        self.gateway: Gateway = build_gateway(replace(base, **settings))
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(_server_config(self.gateway, self.port))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> EdgeGateway:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("gateway did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)

    def register(self, node_id: str, url: str, model: str = "m") -> httpx.Response:
        return httpx.post(f"{self.url}/v1/nodes", json={
            "node_id": node_id, "model": model, "start": 0, "end": 39, "layers": 40,
            "url": url, "tps": 10})

    def rejected(self, source: str = "http") -> float:
        """meshroute_rejected{source} as /metrics shows it."""
        for line in httpx.get(self.url + "/metrics").text.splitlines():
            if line.startswith(f'meshroute_rejected_total{{source="{source}"}}'):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def outcomes(self) -> list[dict[str, Any]]:
        """Every attempt's outcome event so far."""
        return outcomes(self.gateway)


def outcomes(gateway: Gateway) -> list[dict[str, Any]]:
    """Every attempt's outcome event a gateway published so far."""
    return [e for e in gateway.telemetry.events.history() if e["type"] == "outcome"]


class RawNode:
    """A TCP server on loopback that answers every connection with `script(sock, request)`:
    what a hostile or broken node sends, byte by byte."""

    def __init__(self, script: Callable[[socket.socket, bytes], None]) -> None:
        self.requests: list[bytes] = []
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                sock: socket.socket = self.request
                sock.settimeout(30)
                data = b""
                while b"\r\n\r\n" not in data:
                    part = sock.recv(65536)
                    if not part:
                        return
                    data += part
                head, _, rest = data.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(rest) < length:
                    rest += sock.recv(65536)
                outer.requests.append(head + b"\r\n\r\n" + rest)
                with contextlib.suppress(OSError):
                    script(sock, head)

        socketserver.ThreadingTCPServer.allow_reuse_address = True
        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> RawNode:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def completion(tokens: int | str = 20, text: str = "hello") -> bytes:
    """A chat completion body; `tokens` as given, verbatim (a str may be any JSON number)."""
    body = json.dumps({"id": "c", "object": "chat.completion", "model": "m",
                       "choices": [{"index": 0, "finish_reason": "stop",
                                    "message": {"role": "assistant", "content": text}}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": "TOKENS"}})
    return body.replace('"TOKENS"', str(tokens)).encode()


def raw_request(port: int, data: bytes, timeout: float = 15.0) -> bytes:
    """Send `data` on a fresh connection (as far as the server lets it) and read the
    answer until the server closes the connection or `timeout` passes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        # the server may answer and close before we are done: then read its answer
        with contextlib.suppress(OSError):
            sock.sendall(data)
        return read_all(sock)


def read_all(sock: socket.socket) -> bytes:
    out = b""
    try:
        while True:
            part = sock.recv(65536)
            if not part:
                break
            out += part
    except OSError:
        pass
    return out


def status_and_json(raw: bytes) -> tuple[int, dict[str, Any]]:
    """The status and JSON body of a raw HTTP/1.1 answer with a content-length."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)
