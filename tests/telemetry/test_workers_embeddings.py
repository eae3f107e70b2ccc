"""`--workers N`: /v1/routing's embeddings table counts a route's `in_flight` for the whole
gateway, as its chat table does (every worker's own attempts, shared through the workers'
metric files as `meshroute_embeddings_route_in_flight`), in process with two gateways for two
workers."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import anyio
import httpx

from meshroute_middleware.app.gateway import Gateway, build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import RouterConfig, parse_node
from meshroute_middleware.http.inference import NEEDS
from meshroute_middleware.telemetry.worker_files import WorkerFiles
from meshroute_middleware.telemetry.workers import WorkerMetrics

NODE = {"node_id": "n", "model": "m", "start": 0, "end": 0, "layers": 1,
        "url": "http://127.0.0.1:9", "tps": 10.0, "caps": ["embeddings"]}


def _worker(run: Path, pid: int) -> Gateway:
    gateway = build_gateway(replace(ServeSettings(), mdns=False, seed=pid,
                                    router=RouterConfig(explore_share=0.0)))
    gateway.mesh.upsert(parse_node(NODE))
    gateway.telemetry.workers = WorkerMetrics(WorkerFiles(run, pid))
    return gateway


async def _routing(gateway: Gateway) -> Any:
    transport = httpx.ASGITransport(app=gateway.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
        resp = await client.get("/v1/routing")
    assert resp.status_code == 200, resp.text
    return resp.json()


def test_the_embeddings_in_flight_is_every_workers(tmp_path: Path) -> None:
    first, second = _worker(tmp_path, 1), _worker(tmp_path, 2)
    first.embeddings_router.choose("m", needs=NEEDS["embeddings"])  # open on worker 1
    second.embeddings_router.choose("m", needs=NEEDS["embeddings"])  # and on worker 2
    second.embeddings_router.choose("m", needs=NEEDS["embeddings"])
    assert second.telemetry.workers is not None
    second.telemetry.workers.sync(second.telemetry)  # its files, as its own loop writes them
    table = anyio.run(_routing, first)
    (row,) = table["embeddings"]["models"]["m"]["candidates"]
    assert row["in_flight"] == 3, row  # 1 here, 2 on the other worker
    (chat,) = table["models"]["m"]["candidates"]
    assert chat["in_flight"] == 0  # embeddings' attempts are no chat attempts
