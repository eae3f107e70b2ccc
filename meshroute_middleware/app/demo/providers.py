"""Provider routes for the demo: a fake provider with a tight rate limit in one chain with a
mesh model, so that a viewer sees a 429, the key's cooldown and the fallback to the mesh.

NOT ENABLED YET: the gateway does not serve provider routes until issue 12's wiring lands.
`provider_routes()` starts the fake provider and writes the provider config (the format of
examples/providers/meshroute.toml, docs/providers.md); the integrator hands that file to the
demo's gateway settings the way `meshroute serve --config` will, and lets some clients ask for
CHAIN_MODEL.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections import deque
from pathlib import Path

from starlette.types import ASGIApp, Receive, Scope, Send

from node_agent.emulator import EmulatedNode, EmulatorConfig
from node_agent.serving import serve_app

from .mesh import LOOPBACK, QWEN

PROVIDER = "fastco"
PROVIDER_MODEL = "big-model"
CHAIN_MODEL = "auto"  # what a client asks for to be served by the chain
KEY_ENV = "MESHROUTE_DEMO_FASTCO_KEY"
LIMIT = 3  # chats per window: tight, so the demo's traffic hits it within seconds
WINDOW_S = 10.0


class RateLimited:
    """ASGI wrapper: past `limit` chat requests in `window_s`, a provider-style 429 with
    Retry-After; counts what it refused."""

    def __init__(self, app: ASGIApp, limit: int = LIMIT, window_s: float = WINDOW_S) -> None:
        self.app, self.limit, self.window_s = app, limit, window_s
        self._recent: deque[float] = deque()
        self.refused = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            await self.app(scope, receive, send)
            return
        retry_s = self._retry_after_s(time.monotonic())
        if retry_s is None:
            await self.app(scope, receive, send)
            return
        self.refused += 1
        body = json.dumps({"error": {"message": "rate limit exceeded", "type":
                                     "rate_limit_error", "code": "rate_limited"}}).encode()
        await send({"type": "http.response.start", "status": 429,
                    "headers": [(b"content-type", b"application/json"),
                                (b"retry-after", str(retry_s).encode())]})
        await send({"type": "http.response.body", "body": body})

    def _retry_after_s(self, now: float) -> int | None:
        """None when a request may pass (and it is counted), else seconds to wait."""
        while self._recent and now - self._recent[0] >= self.window_s:
            self._recent.popleft()
        if len(self._recent) < self.limit:
            self._recent.append(now)
            return None
        return max(1, round(self.window_s - (now - self._recent[0])))


def providers_toml(base_url: str) -> str:
    """The demo's provider config: the fake provider first in a chain with the mesh model."""
    return f'''# written by `meshroute demo`
[routing]
strategy = "fastest"
chain = ["{PROVIDER}/{PROVIDER_MODEL}", "{QWEN}"]

[[providers]]
name = "{PROVIDER}"
base_url = "{base_url}"
keys = ["env:{KEY_ENV}"]

[[providers.models]]
id = "{PROVIDER_MODEL}"
tier = "large"

[mesh.{QWEN}]
tier = "medium"
'''


async def provider_routes(stack: contextlib.AsyncExitStack,
                          directory: Path) -> tuple[RateLimited, Path]:
    """Start the fake provider (an emulated node behind a rate limit) and write the config
    that puts it in a chain; (the limiter, to announce its 429s; the config file)."""
    node = EmulatedNode(EmulatorConfig(node_id=PROVIDER, model=PROVIDER_MODEL, start=0,
                                       end=31, layers=32, tps=120.0, slots=8, seed=7))
    limiter = RateLimited(node.app())
    url = await stack.enter_async_context(serve_app(limiter, LOOPBACK, 0, graceful_s=1))
    os.environ.setdefault(KEY_ENV, "demo-key-not-a-secret")  # the config names it: env:…
    path = directory / "providers.toml"
    path.write_text(providers_toml(url + "/v1"))
    return limiter, path
