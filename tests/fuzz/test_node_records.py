"""Node records from every source (HTTP, nodes file, mDNS TXT) under hostile input: a record
that validated or InvalidNodeError / ValueError; nothing else reaches the topology."""

from __future__ import annotations

import json
import math
import random
import tempfile
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as hs

from meshroute_middleware.api import GatewayAPI, build_api_app
from meshroute_middleware.app.gateway import load_static_nodes
from meshroute_middleware.core import InvalidNodeError, NodeRecord, Router, RouterConfig, parse_node
from meshroute_middleware.core.contracts import txt
from meshroute_middleware.mesh import Mesh
from meshroute_middleware.telemetry.metrics import Telemetry

from .strategies import FUZZ, JSON, NODE_DICTS, VALID_NODE

pytestmark = pytest.mark.anyio


def _valid(record: NodeRecord) -> None:
    """What every record in the topology must satisfy (parse_node's contract)."""
    assert 0 <= record.start <= record.end < record.layers
    assert record.tps > 0 and math.isfinite(record.tps)
    assert 0 <= record.rep <= 1 and record.queue >= 0
    assert record.url.startswith(("http://", "https://"))
    assert record.node_id and record.model


def _mesh() -> Mesh:
    router = Router(RouterConfig(), clock=lambda: 1000.0, rng=random.Random(0), origin="t")
    return Mesh(router, Telemetry(router))


@FUZZ
@given(NODE_DICTS)
def test_parse_node_validates_or_refuses(data: Any) -> None:
    try:
        record = parse_node(data, now=1.0)
    except InvalidNodeError as exc:
        assert str(exc)
        return
    _valid(record)


TXT_VALUES = hs.text(max_size=30) | hs.binary(max_size=30) | hs.sampled_from(
    ["1", "n1", "m", "0", "9", "10", "http://127.0.0.1:9", "nan", "inf", "1e999"]) | hs.none()
TXT_KEYS = hs.sampled_from(["v", "id", "m", "s", "e", "l", "u", "t", "q", "r", "sig", "hp",
                            "gp"]) | hs.text(max_size=6) | hs.binary(max_size=6)


@FUZZ
@given(hs.dictionaries(TXT_KEYS, TXT_VALUES, max_size=14),
       hs.sampled_from([None, "secret"]))
def test_txt_records_validate_or_refuse(props: dict[Any, Any], secret: str | None) -> None:
    good = txt.encode_node(parse_node(VALID_NODE), secret)
    for mixed in (props, {**good, **props}):
        try:
            record = txt.decode_node(mixed, secret=secret)
        except InvalidNodeError:
            pass
        else:
            _valid(record)
        try:
            tracker = txt.decode_tracker(mixed, secret=secret)
        except txt.TxtError:
            pass
        else:
            assert 0 < tracker.gossip_port < 65536 and tracker.tracker_id


@FUZZ
@given(hs.binary(max_size=200) | hs.lists(NODE_DICTS, max_size=4).map(
    lambda v: json.dumps(v).encode()) | JSON.map(lambda v: json.dumps(v).encode()))
def test_a_nodes_file_is_taken_whole_or_refused_whole(content: bytes) -> None:
    mesh = _mesh()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "nodes.json"
        path.write_bytes(content)
        try:
            load_static_nodes(mesh, str(path))
        except ValueError as exc:
            assert str(path) in str(exc) and "Traceback" not in str(exc)
            assert mesh.nodes() == []
            return
    for record in mesh.nodes():
        _valid(record)


BODIES = (NODE_DICTS.map(lambda v: json.dumps(v).encode()) | hs.binary(max_size=100))


@FUZZ
@given(hs.lists(BODIES, min_size=1, max_size=4))
async def test_post_nodes_answers_json_and_admits_only_valid_records(bodies: list[bytes]) -> None:
    mesh = _mesh()
    app = build_api_app(GatewayAPI(mesh))
    accepted = rejected = 0
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as client:
        for body in bodies:
            resp = await client.post("/v1/nodes", content=body,
                                     headers={"content-type": "application/json"})
            assert resp.status_code in (200, 201, 400), resp.text
            if resp.status_code == 400:
                error = resp.json()["error"]
                assert set(error) >= {"message", "type", "code"}
                assert "Traceback" not in resp.text
                rejected += 1
            else:
                accepted += 1
    assert sum(mesh.telemetry.rejected.values()) == rejected
    assert len(mesh.nodes()) <= accepted
    for record in mesh.nodes():
        _valid(record)
