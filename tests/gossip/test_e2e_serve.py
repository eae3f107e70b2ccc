"""Three `meshroute serve` gateways (real uvicorn, loopback ports) gossiping: traffic goes only to
the first; the others' /v1/routing shows the same learned tps and traffic shares."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack
from typing import Any

import httpx
import pytest

from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig
from tests.upstream import FakeChat, ServerThread, free_port

INTERVAL_S = 0.2
N_TRACKERS = 3


def table(url: str) -> dict[str, dict[str, Any]]:
    resp = httpx.get(f"{url}/v1/routing", params={"model": "m"}, timeout=5)
    assert resp.status_code == 200, resp.text
    return {row["head"]: row for row in resp.json()["models"]["m"]["candidates"]}


def agree(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> bool:
    return all(a[h]["tps"] is not None and b[h]["tps"] is not None
               and abs(a[h]["tps"] - b[h]["tps"]) <= 0.01 * a[h]["tps"] for h in a)


@pytest.fixture
def trackers() -> Iterator[list[str]]:
    ports = [free_port() for _ in range(N_TRACKERS)]
    fast, slow = FakeChat("fast", tokens=32), FakeChat("slow", tokens=32, token_delay_s=0.004)
    with ExitStack() as stack:
        ups = [stack.enter_context(ServerThread(c.app())) for c in (fast, slow)]
        urls = []
        for i, port in enumerate(ports):
            settings = ServeSettings(
                mdns=False, seed=i, tracker_id=f"tracker-{i}",
                router=RouterConfig(explore_share=0.0),
                gossip_listen=f"127.0.0.1:{port}",
                gossip_peers=tuple(f"127.0.0.1:{p}" for p in ports if p != port),
                gossip_interval_s=INTERVAL_S, gossip_secret="e2e secret")
            urls.append(stack.enter_context(ServerThread(build_gateway(settings).app)).url)
        for url in urls:  # every tracker knows the nodes before any traffic
            for name, up in zip(("fast", "slow"), ups, strict=True):
                resp = httpx.post(f"{url}/v1/nodes", json={
                    "node_id": name, "model": "m", "start": 0, "end": 39, "layers": 40,
                    "url": up.url, "tps": 10.0}, timeout=5)
                assert resp.status_code in (200, 201), resp.text
        yield urls


def test_others_learn_what_the_first_measured(trackers: list[str]) -> None:
    first, others = trackers[0], trackers[1:]
    with httpx.Client(timeout=10) as client:
        for i in range(16):  # pinned, so both routes get measured on the first tracker
            resp = client.post(f"{first}/v1/chat/completions", json={
                "model": "m", "route": ["fast" if i % 2 else "slow"],
                "messages": [{"role": "user", "content": "hi"}]})
            assert resp.status_code == 200, resp.text
    truth = table(first)
    assert all(row["status"] == "proven" for row in truth.values()), truth
    start = time.monotonic()
    while time.monotonic() - start < 10 * INTERVAL_S:
        if all(agree(truth, table(url)) for url in others):
            break
        time.sleep(INTERVAL_S / 4)
    waited_s = time.monotonic() - start
    for url in others:
        seen = table(url)
        assert agree(truth, seen), (truth, seen)
        for head, row in seen.items():
            assert row["origins"] >= 1 and row["status"] == "proven"
            assert row["share"] == pytest.approx(truth[head]["share"], abs=0.01)
        metrics = httpx.get(f"{url}/metrics", timeout=5).text
        assert 'meshroute_gossip_entries_total{result="applied"}' in metrics
        refused = [line for line in metrics.splitlines()
                   if line.startswith("meshroute_gossip_rejected_total")]
        # peers started one after another may be unreachable at first; nothing else is refused
        assert all('"unreachable"' in line or '"timeout"' in line for line in refused), refused
    assert waited_s < 10 * INTERVAL_S
