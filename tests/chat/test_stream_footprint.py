"""What an open stream keeps alive in the gateway (issue 15's stall goal).

Every tracked object is walked by each full garbage collection, whose pause grows with them
(docs/benchmarks.md, "Load and soak": ~0.9 µs of CPU per object, ~116 objects per open stream
through uvicorn, so ~100 ms with 1,000 streams open). Here, in-process (the chat path,
aiohttp's client and asyncio; no uvicorn), the objects that N more open streams keep alive,
per stream, must stay under a generous bound: a per-chunk list that grows, a closure or a
task per chunk, a second timer per stream would cross it. The counts are taken when every
stream has had its head's HELD_AFTER chunks and waits for a next one that never comes (the
head holds every answer there), with no await between the collection and the count: no chunk
is in flight however slow the machine is, so nothing here depends on timing."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from meshroute_middleware.app.gateway import Gateway, build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.chat import watchdog
from meshroute_middleware.core import RouterConfig
from meshroute_middleware.forwarding.client import AiohttpForwarder, ForwardTimeouts

from ..upstream import heads_elsewhere

pytestmark = pytest.mark.anyio
N = 40
# Measured 2026-11-30 (aiohttp 3.14, uvloop 0.23): 93.0 per stream, the same in every run;
# 99.1 with the second timer per chunk that forwarding.py had before (the head's idle
# timeout, now aiohttp's read timer). With uvicorn in front, the benchmark counts ~116
# (benchmarks/bench_stream_objects.py). 97.3 on 2026-12-01, one object (or less) for each of:
# the request's `via` entry (the loop check), the answered/failed counter's send wrapper,
# the request guard's Host check, the answer's one deadline timer (request_timeout_s).
# +1 on 2026-12-04 (issue 32): the filter that keeps a stream as its client asked while the
# upstream is asked for usage (chat/stream_usage.py), 99.0 -> 99.7-100.6 in five runs.
# 102.8 on 2026-12-07 (three runs alike; issues 32 and 36): the request's token estimate,
# computed once at parse and kept with it (one parse per request), and the one relay's
# deadline (asyncio.timeout) around the upstream's chunks; each one object per stream.
# 101.6 -> 104.9 on 2026-12-07, evening (issue 34): the stream's transcript kept for a
# mid-stream failover (chat/continuation.py) and the learned gap's pacer (chat/deadlines.py
# Paced), one small slotted object each plus what they hold; 120.6 seen once for Responses
# under a loaded parallel run (115.9 quiet), the chunks in flight counted with the streams.
# Counted at rest (the head holds every stream after HELD_AFTER chunks), 2026-12-07: chat
# 104.5-104.9, Responses 119.0, the same with 1, 4, 16 or 64 chunks per stream and at load 8.
MAX_OBJECTS_PER_STREAM = 108
# A /v1/responses stream adds its translation: the request's echo (its tools, text format),
# the stream's items and the SSE line splitter. Measured 2026-12-02: 114.3 per stream (98.6
# for chat in the same runs), the same in three runs; a list or closure per chunk crosses it.
MAX_OBJECTS_PER_RESPONSES_STREAM = 123

# A head streaming HELD_AFTER tokens at once, then holding every answer open (a wait, no
# polling): the streams stay open, idle, for as long as the test runs.
HELD_AFTER = 16
_HEAD = """
import asyncio, json, sys
from starlette.applications import Starlette
from starlette.responses import StreamingResponse
from starlette.routing import Route
from tests.upstream import ServerThread

def chunk(i):
    delta = {"index": 0, "delta": {"content": f"t{i} "}, "finish_reason": None}
    return ("data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 0,
                                   "model": "m", "choices": [delta]}) + "\\n\\n").encode()

async def chat(request):
    await request.body()
    async def stream():
        for i in range(HELD_AFTER):
            yield chunk(i)
        await asyncio.Event().wait()
    return StreamingResponse(stream(), media_type="text/event-stream")

app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
server = ServerThread(app).__enter__()
print(json.dumps(server.url), flush=True)
sys.stdin.read()
""".replace("HELD_AFTER", str(HELD_AFTER))
LAST = f"t{HELD_AFTER - 1} ".encode()  # the last token the head sends


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, Any]]:
    """On uvloop, as `meshroute serve` runs: asyncio's own loop keeps cancelled timer handles
    in its heap until they are due (aiohttp restarts its read timer at every chunk), which
    made the count vary from run to run."""
    return ("asyncio", {"use_uvloop": True})


@pytest.fixture(scope="module")
def head() -> Iterator[str]:
    with heads_elsewhere(_HEAD) as url:
        yield str(url)


@pytest.fixture
async def gateway(head: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Gateway]:
    monkeypatch.setattr(watchdog, "WATCH_AFTER_S", 0.0)  # every stream gets its watcher
    # a held stream is not cut for its silence while the test runs (pytest's timeout bounds it)
    forwarder = AiohttpForwarder(ForwardTimeouts(idle_s=3600.0))
    gw = build_gateway(ServeSettings(mdns=False, seed=7,
                                     router=RouterConfig(explore_share=0.0)),
                       forwarder=forwarder)
    gw.mesh.upsert_raw({"node_id": "slow", "model": "m", "start": 0, "end": 9, "layers": 10,
                        "url": head, "tps": 5.0}, "test")
    yield gw
    await forwarder.aclose()


CHAT = ("/v1/chat/completions", {"model": "m", "stream": True,
                                  "messages": [{"role": "user", "content": "hi"}]})
RESPONSES = ("/v1/responses", {"model": "m", "stream": True, "input": "hi"})


class Stream:
    """One chat stream straight into the ASGI app; counts chunks, keeps none; `held` once the
    head's last token came through (nothing more will)."""

    def __init__(self, app: Any, api: tuple[str, dict[str, Any]] = CHAT) -> None:
        self.path, self.body = api
        self.chunks = 0
        self.held = asyncio.Event()
        self.task = asyncio.ensure_future(app(self.scope(), self.receive, self.send))
        self._delivered = False

    def scope(self) -> dict[str, Any]:
        return {"type": "http", "method": "POST", "path": self.path,
                "headers": [(b"content-type", b"application/json")], "query_string": b"",
                "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2), "scheme": "http",
                "http_version": "1.1", "root_path": "", "state": {}}

    async def receive(self) -> dict[str, Any]:
        if not self._delivered:
            self._delivered = True
            return {"type": "http.request", "body": json.dumps(self.body).encode(),
                    "more_body": False}
        await asyncio.Event().wait()  # never disconnects
        raise AssertionError("unreachable")

    async def send(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.body" and message.get("body"):
            self.chunks += 1
            if LAST in message["body"]:
                self.held.set()


def _tracked() -> int:
    gc.collect()
    return len(gc.get_objects())


@pytest.mark.parametrize(("api", "bound"), [(CHAT, MAX_OBJECTS_PER_STREAM),
                                            (RESPONSES, MAX_OBJECTS_PER_RESPONSES_STREAM)])
async def test_an_open_stream_keeps_few_objects_alive(
        gateway: Gateway, api: tuple[str, dict[str, Any]], bound: int) -> None:
    warm = [Stream(gateway.app, api) for _ in range(4)]  # pools, caches, the watchdog's timer
    await asyncio.gather(*(s.held.wait() for s in warm))
    streams: list[Stream] = []
    try:
        counts = []
        for _ in range(2):
            batch = [Stream(gateway.app, api) for _ in range(N)]
            streams += batch
            await asyncio.gather(*(s.held.wait() for s in batch))  # pytest's timeout bounds it
            counts.append(_tracked())
        per_stream = (counts[1] - counts[0]) / N
        assert all(not s.task.done() for s in streams)  # all still open
        assert 0 < per_stream <= bound, per_stream
    finally:
        for s in warm + streams:
            s.task.cancel()
        await asyncio.gather(*(s.task for s in warm + streams), return_exceptions=True)
