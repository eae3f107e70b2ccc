"""The forwarder closed under open streams (a server stopping, after a drain waited for them,
or an app embedding the middleware whose lifespan ends first): each stream ends quietly, with
the API's shutting-down error event, never as an internal error of meshroute (aiohttp's
"Connection closed." RuntimeError from a stream whose connection the closing session cut)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import httpx
import pytest

from meshroute_middleware.app.config import GatewayConfig
from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig, parse_node
from meshroute_middleware.core.providers.config import parse_providers_config

from ..providers.fake_provider import FakeProvider, Reply
from ..providers.gateway import ENV, providers_doc
from ..upstream import FakeChat, ServerThread

PATIENCE_S = 60.0


class LoopOf:
    """An ASGI wrapper that remembers the server's event loop."""

    def __init__(self, app: Any) -> None:
        self.app, self.loop = app, None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.loop = asyncio.get_running_loop()
        await self.app(scope, receive, send)


@contextmanager
def _gateway(path: str) -> Iterator[tuple[Any, str]]:
    """A gateway whose model `m` streams slowly (20 s: open when the forwarder closes), over
    a mesh node (`mesh`) or a provider chain (`provider`); yields it and the model to ask."""
    if path == "mesh":
        slow = FakeChat("slow", tokens=400, token_delay_s=0.05)
        with ServerThread(slow.app()) as head:
            gateway = build_gateway(replace(ServeSettings(), mdns=False, seed=3,
                                            router=RouterConfig(explore_share=0.0)))
            gateway.mesh.upsert(parse_node({"node_id": "slow", "model": "m", "start": 0,
                                            "end": 0, "layers": 1, "url": head.url,
                                            "tps": 10}))
            yield gateway, "m"
        return
    fast, slow_provider = FakeProvider("fast"), FakeProvider("slow", models=("small-model",))
    fast.default = Reply(tokens=400, token_delay_s=0.05)
    with fast.serve(), slow_provider.serve():
        doc = providers_doc(fast, slow_provider)
        settings = replace(ServeSettings(), mdns=False, seed=3, state_file=":memory:",
                           providers=parse_providers_config(doc))
        yield build_gateway(GatewayConfig.build(settings, ENV)), "auto"


@pytest.mark.parametrize("path", ["mesh", "provider"])
def test_a_stream_open_when_the_forwarder_closes_ends_quietly(
        caplog: pytest.LogCaptureFixture, path: str) -> None:
    lines: list[str] = []
    first = threading.Event()
    with _gateway(path) as (gateway, model):
        app = LoopOf(gateway.app)
        with ServerThread(app) as server:
            status: list[int] = []

            def read() -> None:
                try:
                    with httpx.stream("POST", f"{server.url}/v1/chat/completions",
                                      timeout=PATIENCE_S, json={
                                          "model": model, "stream": True,
                                          "messages": [{"role": "user", "content": "hi"}]}
                                      ) as r:
                        status.append(r.status_code)
                        for line in r.iter_lines():
                            lines.append(line)
                            if '"content"' in line:
                                first.set()
                except httpx.HTTPError as exc:
                    lines.append(f"transport: {exc!r}")
                finally:
                    first.set()

            reader = threading.Thread(target=read, daemon=True)
            with caplog.at_level(logging.INFO):
                reader.start()
                assert first.wait(PATIENCE_S) and status == [200], lines
                assert app.loop is not None and gateway.forwarder is not None
                asyncio.run_coroutine_threadsafe(gateway.forwarder.aclose(),
                                                 app.loop).result(PATIENCE_S)
                reader.join(PATIENCE_S)
    assert not reader.is_alive()
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [], [r.getMessage() for r in errors]  # no "internal error", no traceback
    data = [line for line in lines if line.startswith("data: ")]
    assert '"shutting_down"' in data[-1] and len(data) < 400, lines[-3:]  # ended, cut short
    assert any("closed its upstream connections" in r.getMessage() for r in caplog.records)
