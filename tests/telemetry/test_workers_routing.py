"""`meshroute serve --workers 2`, real processes: /v1/routing's per-route `in_flight` is the
whole gateway's (every worker's open attempts), and every worker answers the same cached
document (one cache for the gateway, not one per worker)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from ..upstream import FakeChat, ServerThread, free_port
from .test_workers_view import DEADLINE_S, ROOT, Gateway

PER_WORKER = 2  # streams held open on each worker


@pytest.fixture
def slow_gateway(tmp_path: Path) -> Iterator[Gateway]:
    head = FakeChat("n", tokens=4000, token_delay_s=0.02)  # 80 s: held open, then left
    with ServerThread(head.app()) as up:
        nodes = tmp_path / "nodes.json"
        nodes.write_text(json.dumps([{"node_id": "n", "model": "m", "start": 0, "end": 9,
                                      "layers": 10, "url": up.url, "tps": 10.0}]))
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "meshroute_middleware.app.cli", "serve",
                                 "--workers", "2", "--port", str(port), "--no-mdns",
                                 "--nodes-file", str(nodes), "--log-level", "warning",
                                 "--state-file", str(tmp_path / "state.db")], cwd=ROOT)
        gw = Gateway(f"http://127.0.0.1:{port}", proc)
        try:
            deadline = time.monotonic() + DEADLINE_S
            while True:
                try:
                    if httpx.get(gw.url + "/healthz", timeout=10).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline and gw.alive()
                time.sleep(0.1)
            yield gw
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(60)


class Held(threading.Thread):
    """One stream held open on one connection; `tracker` names the worker serving it."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url, self.tracker = url, ""
        self.streaming, self.stop = threading.Event(), threading.Event()

    def run(self) -> None:
        try:
            with httpx.Client(base_url=self.url, timeout=DEADLINE_S) as client:
                self.tracker = client.get("/healthz").json()["tracker"]
                with client.stream("POST", "/v1/chat/completions", json={
                        "model": "m", "stream": True,
                        "messages": [{"role": "user", "content": "hi"}]}) as resp:
                    for line in resp.iter_lines():
                        if '"content"' in line:
                            self.streaming.set()
                        if self.stop.is_set():
                            return
        finally:
            self.streaming.set()


def _hold_on_both(url: str) -> list[Held]:
    """Streams until each worker serves PER_WORKER of them (the kernel picks the worker of
    each new connection); the extra ones stay open too."""
    held: list[Held] = []
    deadline = time.monotonic() + DEADLINE_S
    while True:
        stream = Held(url)
        stream.start()
        assert stream.streaming.wait(DEADLINE_S) and stream.tracker
        held.append(stream)
        per = [sum(h.tracker == t for h in held) for t in {h.tracker for h in held}]
        if len(per) == 2 and min(per) >= PER_WORKER:
            return held
        assert time.monotonic() < deadline and len(held) < 40, per


def _in_flight(table: dict[str, object]) -> int:
    rows = table["models"]["m"]["candidates"]  # type: ignore[index]
    return int(sum(row["in_flight"] for row in rows))


def test_routing_in_flight_counts_every_workers_streams(slow_gateway: Gateway) -> None:
    held = _hold_on_both(slow_gateway.url)
    try:
        shown: dict[str, int] = {}
        deadline = time.monotonic() + DEADLINE_S
        while len(shown) < 2 or set(shown.values()) != {len(held)}:
            assert time.monotonic() < deadline and slow_gateway.alive(), (shown, len(held))
            tracker, resp = slow_gateway.read("/v1/routing")
            shown[tracker] = _in_flight(resp.json())
        in_metrics = slow_gateway.read("/metrics")[1].text
        assert f'meshroute_route_in_flight{{signature="m|n[0-9]"}} {len(held)}.0' in in_metrics
    finally:
        for stream in held:
            stream.stop.set()
    deadline = time.monotonic() + DEADLINE_S
    while any(_in_flight(slow_gateway.read("/v1/routing")[1].json()) for _ in range(6)):
        assert time.monotonic() < deadline, "the streams that ended still count"
        time.sleep(0.2)
