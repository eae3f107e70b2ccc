"""`meshroute serve --workers 2` seen as one gateway, with real processes: /metrics, /v1/routing
and the event stream count every worker's requests, whichever worker a client reaches.

Each new connection lands on either worker (SO_REUSEPORT), so every check below reads through
many connections and names the worker that answered (/healthz on the same connection)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..upstream import FakeChat, ServerThread, free_port

ROOT = Path(__file__).resolve().parents[2]
REQUESTS = 12
DEADLINE_S = 60  # generous: a loaded machine starts two workers slowly


class Gateway:
    def __init__(self, url: str, proc: subprocess.Popen[bytes]) -> None:
        self.url, self.proc = url, proc

    def alive(self) -> bool:
        return self.proc.poll() is None

    def read(self, path: str) -> tuple[str, httpx.Response]:
        """(the answering worker's tracker id, its answer to GET `path`), on one connection."""
        with httpx.Client(base_url=self.url, timeout=20) as client:
            tracker = client.get("/healthz").json()["tracker"]
            return tracker, client.get(path)

    def chat(self, n: int) -> None:
        """n chat requests, each on a new connection (so they spread over the workers)."""
        for _ in range(n):
            resp = httpx.post(self.url + "/v1/chat/completions", timeout=20,
                              json={"model": "m", "messages": [{"role": "user",
                                                                "content": "hi"}]})
            assert resp.status_code == 200, resp.text


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[Gateway]:
    head = FakeChat("n", tokens=5)
    with ServerThread(head.app()) as up:
        nodes = tmp_path / "nodes.json"
        nodes.write_text(json.dumps([{"node_id": "n", "model": "m", "start": 0, "end": 9,
                                      "layers": 10, "url": up.url, "tps": 10.0}]))
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "meshroute_middleware.app.cli", "serve",
                                 "--workers", "2", "--port", str(port), "--no-mdns",
                                 "--nodes-file", str(nodes), "--log-level", "warning"],
                                cwd=ROOT)
        gw = Gateway(f"http://127.0.0.1:{port}", proc)
        try:
            seen: set[str] = set()
            deadline = time.monotonic() + DEADLINE_S
            while len(seen) < 2:  # both workers serve
                assert time.monotonic() < deadline and gw.alive(), seen
                try:
                    seen.add(httpx.get(gw.url + "/healthz", timeout=10).json()["tracker"])
                except httpx.TransportError:
                    time.sleep(0.1)
            yield gw
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0


def _total(exposition: str, sample: str, **labels: str) -> float:
    return sum(s.value for family in text_string_to_metric_families(exposition)
               for s in family.samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


def test_metrics_count_every_worker_and_never_go_back(gateway: Gateway) -> None:
    answered: list[float] = []
    trackers: set[str] = set()
    for _ in range(REQUESTS // 2):  # scrapes between the requests too
        gateway.chat(2)
        tracker, resp = gateway.read("/metrics")
        trackers.add(tracker)
        answered.append(_total(resp.text, "meshroute_requests_total", result="answered"))
    deadline = time.monotonic() + DEADLINE_S
    while answered[-1] < REQUESTS:  # a sibling's counts reach a scrape within a second
        assert time.monotonic() < deadline, answered
        tracker, resp = gateway.read("/metrics")
        answered.append(_total(resp.text, "meshroute_requests_total", result="answered"))
    last = []
    for i in range(100):
        tracker, resp = gateway.read("/metrics")
        trackers.add(tracker)
        text = resp.text
        last.append((_total(text, "meshroute_requests_total", result="answered"),
                     _total(text, "meshroute_outcomes_total"),
                     _total(text, "meshroute_decisions_total")))
        if i >= 9 and len(trackers) == 2:
            break
    assert len(trackers) == 2, "every scrape reached one worker: the check proves nothing"
    assert answered == sorted(answered), answered  # never backwards, during the traffic too
    assert all(row == (REQUESTS, REQUESTS, REQUESTS) for row in last), last


class Subscriber(threading.Thread):
    """Reads /v1/routing/events into `events` until `stop` is set."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.events: list[dict[str, Any]] = []
        self.open = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=httpx.Timeout(10, read=None)) as client, \
                client.stream("GET", self.url + "/v1/routing/events") as resp:
            self.open.set()
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    self.events.append(json.loads(line[6:]))
                if self.stop.is_set():
                    return


def test_a_subscriber_sees_every_workers_outcomes(gateway: Gateway) -> None:
    sub = Subscriber(gateway.url)
    sub.start()
    assert sub.open.wait(DEADLINE_S)
    gateway.chat(REQUESTS)
    deadline = time.monotonic() + DEADLINE_S
    while len([e for e in sub.events if e["type"] == "outcome"]) < REQUESTS:
        assert time.monotonic() < deadline and gateway.alive(), sub.events
        time.sleep(0.05)
    time.sleep(0.5)  # no more than one outcome per request arrives
    sub.stop.set()
    gateway.chat(1)  # an event wakes the reader to stop
    outcomes = [e for e in sub.events if e["type"] == "outcome"]
    assert len(outcomes) in (REQUESTS, REQUESTS + 1), outcomes
    assert all(e["ok"] for e in outcomes)
    assert {e["worker"] for e in outcomes} == {0, 1}, outcomes  # from both workers
    ids = [e["id"] for e in sub.events]
    assert len(ids) == len(set(ids)), ids


def test_routing_counts_the_whole_gateway(gateway: Gateway) -> None:
    gateway.chat(REQUESTS)
    shown: dict[str, tuple[int, int]] = {}
    deadline = time.monotonic() + DEADLINE_S
    while len(shown) < 2 or set(shown.values()) != {(REQUESTS, REQUESTS)}:
        assert time.monotonic() < deadline, shown
        tracker, resp = gateway.read("/v1/routing")
        table = resp.json()
        shown[tracker] = (table["requests"]["answered"], sum(table["objectives"].values()))
    assert all(v == (REQUESTS, REQUESTS) for v in shown.values())


def test_routing_never_goes_back_whichever_worker_answers(gateway: Gateway) -> None:
    """One cached document for the gateway: with a cache per worker, a worker's older copy
    answered after its sibling's newer one showed fewer requests than the read before."""
    shown: list[tuple[str, int]] = []
    for _ in range(30):
        gateway.chat(1)
        tracker, resp = gateway.read("/v1/routing")
        shown.append((tracker, resp.json()["requests"]["answered"]))
    assert len({tracker for tracker, _ in shown}) == 2, shown
    counts = [answered for _, answered in shown]
    assert counts == sorted(counts), shown
