"""A forwarded request leaves no cyclic garbage behind (issue 15's stall goal).

Acyclic garbage is freed by reference counting at once; each reference cycle made per request
waits for a garbage collection, and enough of them reach the oldest generation that full
collections (100-300 ms on a loaded gateway, docs/benchmarks.md "Load and soak") stall the
event loop. So: with the collector disabled, N requests of each kind through the real
gateway (real aiohttp forwarder, heads in a separate process so that their garbage is not
counted) must leave nothing for `gc.collect()` to find. Deterministic: no timing is asserted,
and the disconnect watchdog is made to watch every request (WATCH_AFTER_S = 0)."""

from __future__ import annotations

import asyncio
import collections
import gc
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from meshroute_middleware.app.gateway import Gateway, build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.chat import watchdog
from meshroute_middleware.core import RouterConfig
from meshroute_middleware.forwarding.client import AiohttpForwarder, ForwardTimeouts

from .conftest import FakeClock
from .upstream import free_port, heads_elsewhere

pytestmark = pytest.mark.anyio
REQUESTS = 20
CLOCK = FakeClock()  # advanced a day before each fallback request: the failed heads' record
#                      decays back to their priors, and they are tried first again

# The heads, in a process of their own: FakeChat apps on real uvicorn, one port each.
_HEADS = """
import json, sys
from tests.upstream import FakeChat, ServerThread
heads = {"good": FakeChat("good", tokens=4, token_delay_s=0.005),
         "bad": FakeChat("bad", status=500), "client_error": FakeChat("c", status=400)}
servers = {name: ServerThread(chat.app()).__enter__() for name, chat in heads.items()}
print(json.dumps({name: s.url for name, s in servers.items()}), flush=True)
sys.stdin.read()
"""


@dataclass
class Heads:
    urls: dict[str, str]


@pytest.fixture(scope="module")
def heads() -> Iterator[Heads]:
    with heads_elsewhere(_HEADS) as urls:
        urls["dead"] = f"http://127.0.0.1:{free_port()}"  # nothing listens there
        yield Heads(urls)


def _node(node_id: str, model: str, url: str, tps: float) -> dict[str, Any]:
    return {"node_id": node_id, "model": model, "start": 0, "end": 9, "layers": 10,
            "url": url, "tps": tps}


@pytest.fixture
async def gateway(heads: Heads, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.setattr(watchdog, "WATCH_AFTER_S", 0.0)  # every request gets a watcher
    settings = ServeSettings(mdns=False, seed=7, router=RouterConfig(explore_share=0.0))
    forwarder = AiohttpForwarder(ForwardTimeouts(first_byte_s=10.0))
    gw = build_gateway(settings, forwarder=forwarder, clock=CLOCK)
    u = heads.urls
    for record in (_node("good", "m", u["good"], 10.0),
                   # model "f": the failing heads are the best priors, so tried first
                   _node("bad", "f", u["bad"], 50.0), _node("dead", "f", u["dead"], 40.0),
                   _node("good-f", "f", u["good"], 10.0),
                   _node("dead-only", "x", u["dead"], 10.0),
                   _node("rude", "c", u["client_error"], 10.0)):
        gw.mesh.upsert_raw(record, "test")
    yield gw
    await forwarder.aclose()


async def _post(app: Any, body: dict[str, Any] | bytes) -> list[dict[str, Any]]:
    """One chat request straight into the ASGI app; the client stays connected until the
    response ends (the watchdog's receive() is then cancelled)."""
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    delivered = False

    async def receive() -> dict[str, Any]:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": raw, "more_body": False}
        await asyncio.Event().wait()  # never disconnects
        raise AssertionError("unreachable")

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions",
             "headers": [(b"content-type", b"application/json")], "query_string": b"",
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "scheme": "http",
             "http_version": "1.1", "root_path": "", "state": {}}
    await app(scope, receive, send)
    return sent


def _headers(sent: list[dict[str, Any]]) -> dict[bytes, bytes]:
    return dict(sent[0]["headers"])


CASES = {
    "non-streaming": ({"model": "m"}, 200, None),
    "streaming": ({"model": "m", "stream": True}, 200, None),
    # the 500 head, then the refused connection, then the good one
    "fallback after failed heads": ({"model": "f"}, 200, b"fallback"),
    "every route failed (502)": ({"model": "x"}, 502, None),
    "a head's 400 relayed": ({"model": "c"}, 400, None),
    "unknown model (404)": ({"model": "nobody"}, 404, None),
    "invalid JSON (400)": (None, 400, None),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_forwarded_request_leaves_no_cyclic_garbage(gateway: Gateway,
                                                            case: str) -> None:
    body, status, mode = CASES[case]
    payload: Any = body if body is not None else b"{not json"
    full = ({**payload, "messages": [{"role": "user", "content": "hi"}]}
            if isinstance(payload, dict) else payload)

    async def one() -> None:
        if case.startswith("fallback"):
            CLOCK.advance(86_400.0)
        sent = await _post(gateway.app, full)
        assert sent[0]["status"] == status, sent
        if mode is not None:
            assert _headers(sent)[b"x-meshroute-mode"] == mode
            assert _headers(sent)[b"x-meshroute-route"] == b"f|good-f[0-9]"

    await one()  # warm-up: the session, its connection pool, first-use caches
    await asyncio.sleep(0)
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds stays in gc.garbage, to name it
    try:
        for _ in range(REQUESTS):
            await one()
        found = gc.collect()
        kinds = collections.Counter(type(o).__qualname__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert found == 0, (f"{REQUESTS} requests left {found} objects in reference cycles: "
                        + ", ".join(f"{n} {k}" for k, n in kinds.most_common(12)))
    if case.startswith("fallback"):  # each request failed on both bad heads first
        tried = collections.Counter((e["head"], e["error"]) for e in
                                    gateway.telemetry.events.history() if e["type"] == "outcome")
        assert tried[("bad", "http_5xx")] == tried[("dead", "connect")] == REQUESTS + 1
