"""Provider routes in the demo: a fake provider with a tight rate limit first in a chain
with a mesh model, so that a viewer sees a 429, the key's cooldown and the fallback to the mesh.

`provider_routes()` starts the fake provider on 127.0.0.1 and writes the provider config (the
format of examples/providers/meshroute.toml, docs/providers.md) that the demo's gateway loads
as `meshroute serve --config` does; some clients ask for CHAIN_MODEL. `ChainWatch` follows
the chain from what the gateway publishes (its event stream, its key states) and what the
clients get back (`x-meshroute-route`, `x-meshroute-tried`), and says what happens.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send

from meshroute_middleware.app.demo.mesh import LOOPBACK, QWEN
from node_agent.emulator import EmulatedNode, EmulatorConfig
from node_agent.serving import serve_app

PROVIDER = "fastco"
PROVIDER_MODEL = "big-model"
PROVIDER_ROUTE = f"{PROVIDER}/{PROVIDER_MODEL}"
CHAIN_MODEL = "auto"  # what a client asks for to be served by the chain
CHAIN_SHARE = 0.25  # the chain's weight beside the mesh models' (mesh.CLIENT_SHARE)
KEY_ENV = "MESHROUTE_DEMO_FASTCO_KEY"
DEMO_KEY = "demo-key-not-a-secret"  # the fake provider takes any key
LIMIT = 4  # chats per window: tight, so the demo's traffic hits it within seconds
WINDOW_S = 20.0  # and long enough that the cooldown is there to watch


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
    """The demo's provider config: the fake provider first in a chain with the mesh model.
    Its limit is not declared (no `rpm`): the gateway learns it from the 429s, as it must
    from a provider whose limits nobody wrote down. `smartest` puts the frontier model first
    before anything is measured (under `fastest` both start from the same speed prior, and
    the mesh, measured first, could keep the untried provider out for the whole demo)."""
    return f'''# written by `meshroute demo`
[routing]
strategy = "smartest"
chain = ["{PROVIDER_ROUTE}", "{QWEN}"]

[[providers]]
name = "{PROVIDER}"
base_url = "{base_url}"
keys = ["env:{KEY_ENV}"]

[[providers.models]]
id = "{PROVIDER_MODEL}"
tier = "frontier"

[mesh.{QWEN}]
tier = "medium"
'''


@dataclass(frozen=True)
class DemoProviders:
    """The running fake provider: its limiter (what it refused), the config file written for
    the gateway and the environment its `env:` key reference resolves in."""

    limiter: RateLimited
    config: Path
    environ: dict[str, str]


async def provider_routes(stack: contextlib.AsyncExitStack, directory: Path) -> DemoProviders:
    """Start the fake provider (an emulated node behind a rate limit) on 127.0.0.1 and write
    the config that puts it in a chain."""
    node = EmulatedNode(EmulatorConfig(node_id=PROVIDER, model=PROVIDER_MODEL, start=0,
                                       end=31, layers=32, tps=120.0, slots=8, seed=7))
    limiter = RateLimited(node.app())
    url = await stack.enter_async_context(serve_app(limiter, LOOPBACK, 0, graceful_s=1))
    path = directory / "providers.toml"
    path.write_text(providers_toml(url + "/v1"))
    return DemoProviders(limiter, path, {KEY_ENV: DEMO_KEY})


@dataclass
class ChainCounts:
    """What the clients of the chain got, and the 429s the gateway absorbed for them."""

    requests: int = 0
    by_provider: int = 0
    after_failure: int = 0  # served by the mesh after the provider failed (a 429)
    while_cooling: int = 0  # served by the mesh while the provider's key cooled down
    ranked_first: int = 0  # served by the mesh, ranked above a ready provider key
    rate_limited: int = 0  # 429s the gateway's event stream reported

    def summary(self) -> str:
        """The summary line's part about the chain."""
        mesh = self.after_failure + self.while_cooling + self.ranked_first
        return (f"chain '{CHAIN_MODEL}': {self.requests} requests, {self.by_provider} by "
                f"{PROVIDER_ROUTE}, {mesh} by the mesh ({self.after_failure} right after a "
                f"429, {self.while_cooling} while its key cooled down, {self.ranked_first} "
                f"ranked first); 429s absorbed: {self.rate_limited}")


@dataclass
class ChainWatch:
    """Follows the chain: the gateway's events and key states, the clients' answers."""

    gateway: Any  # app.gateway.Gateway with provider routes
    counts: ChainCounts = field(default_factory=ChainCounts)
    _event_id: int = 0
    _keys: dict[tuple[str, int], str] = field(default_factory=dict)
    # whether this cooldown's first fallback was announced: the client's `-tried` header proves
    # the fallback by itself, so the announcement never waits for the 429 event to be read
    _fallback_told: bool = False
    served_by: dict[str, int] = field(default_factory=dict)

    def answered(self, route: str, tried: list[str]) -> str | None:
        """A client's answer to CHAIN_MODEL (its `x-meshroute-route` and `-tried`); the line
        to announce on the first fallback after a 429."""
        self.counts.requests += 1
        served = route.split("|", 1)[0].split("#", 1)[0]
        self.served_by[served] = self.served_by.get(served, 0) + 1
        if route.startswith(PROVIDER + "/"):
            self.counts.by_provider += 1
            return None
        passed = [t for t in tried if t.startswith(PROVIDER + "/")]
        if not passed:
            cooling = any(state != "ready" for _, _, state in self.key_states(time.time()))
            if cooling:
                self.counts.while_cooling += 1
            else:
                self.counts.ranked_first += 1
            return None
        self.counts.after_failure += 1
        if self._fallback_told:
            return None
        self._fallback_told = True
        via = route.split("|", 1)[-1].replace("->", "→")
        return (f"'{CHAIN_MODEL}' fell back from {', '.join(passed)} to {served} ({via}): "
                "the client got its answer, not the 429")

    def tick(self, now: float) -> list[str]:
        """What happened since the last tick: 429s (and the cooldowns they started) from the
        gateway's event stream, keys that came back from their cooldown."""
        events = self.gateway.telemetry.events.history(self._event_id)
        if events:
            self._event_id = events[-1]["id"]
        limited = [e for e in events if e["type"] == "outcome" and e["mode"] == "provider"
                   and e["error"] == "http_429"]
        lines = []
        for key_route in sorted({e["signature"] for e in limited}):
            mine = [e for e in limited if e["signature"] == key_route]
            until = max((e.get("cooldown_until") or now) for e in mine)
            times = f" {len(mine)}x" if len(mine) > 1 else ""
            lines.append(f"{key_route} answered 429{times} (rate limit): key "
                         f"{key_route.rpartition('#')[2]} cools down for {until - now:.0f} s")
        if limited:
            self.counts.rate_limited += len(limited)
        for route, key, state in self.key_states(now):
            before = self._keys.get((route, key))
            self._keys[(route, key)] = state
            if before not in (None, "ready") and state == "ready":
                self._fallback_told = False  # the next 429's fallback is news again
            if before == "cooldown" and state == "ready":
                lines.append(f"{route}#{key} cooled down: '{CHAIN_MODEL}' may take it again")
        return lines

    def key_states(self, now: float) -> list[tuple[str, int, str]]:
        """(provider route, key, state) of every provider key."""
        providers = self.gateway.providers
        return [(f"{p.name}/{m.id}", row["key"], row["state"])
                for p in providers.cfg.providers for m in p.models
                for row in providers.gates.key_states(p, m, now)]

    def rows(self, now: float) -> list[str]:
        """The chain as the view shows it: its order now, each key's state, who served."""
        providers = self.gateway.providers
        res = providers.resolve(CHAIN_MODEL, self.gateway.router.models())
        view = providers.chain_view(res, now)
        lines = [f"  {CHAIN_MODEL}  (provider chain, strategy {view['strategy']})"]
        for i, row in enumerate(view["chain"], 1):
            keys = "   ".join(_key_text(k, now) for k in row["keys"]) or "mesh routes above"
            lines.append(f"    {i}. {row['route']:<20} score {row['score']:.2f}   "
                         f"served {self.served_by.get(row['route'], 0):>4}   {keys}")
        return lines


def _key_text(key: dict[str, Any], now: float) -> str:
    text = f"key {key['key']} {key['state']}"
    if key["state"] != "ready" and key["until"]:
        text += f" {max(0.0, key['until'] - now):.0f} s"
    return text
