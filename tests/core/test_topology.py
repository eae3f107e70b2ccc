"""Node validation (parse_node) and topology epochs: join, leave, shard change, refresh."""

from __future__ import annotations

from typing import Any

import pytest

from meshroute_middleware.core import InvalidNodeError, NodeRecord, Topology, parse_node

VALID: dict[str, Any] = {"node_id": "gpu", "model": "m", "start": 0, "end": 21, "layers": 40,
                         "url": "http://127.0.0.1:9001", "tps": 50.0}


def node(node_id: str, start: int, end: int, layers: int = 40, **kw: Any) -> NodeRecord:
    return NodeRecord(node_id, kw.pop("model", "m"), start, end, layers,
                      kw.pop("url", f"http://{node_id}.test"), **kw)


BAD = [  # (changes to a valid record, fragment of the message)
    ({"start": -1}, "negative"),
    ({"end": -3, "start": 0}, "negative"),
    ({"start": 22, "end": 21}, "after"),
    ({"end": 40}, "below 'layers'"),
    ({"layers": 0, "end": 0}, "'layers' must be in"),
    ({"layers": 10**9}, "'layers' must be in"),
    ({"tps": 0}, "'tps' must be in"),
    ({"tps": -5}, "'tps' must be in"),
    ({"tps": 1e12}, "'tps' must be in"),
    ({"tps": float("nan")}, "finite"),
    ({"tps": float("inf")}, "finite"),
    ({"tps": "1e400"}, "finite"),
    ({"tps": "fast"}, "must be a number"),
    ({"tps": True}, "boolean"),
    ({"start": True}, "boolean"),
    ({"start": "--5"}, "integer"),
    ({"start": "²"}, "integer"),
    ({"start": "1_0"}, "integer"),
    ({"start": 1.5}, "integer"),
    ({"start": None}, "required"),
    ({"start": [0]}, "integer"),
    ({"url": "ftp://example.test"}, "http(s) URL"),
    ({"url": "javascript:alert(1)"}, "http(s) URL"),
    ({"url": "http://"}, "http(s) URL"),
    ({"url": "http://a b.test"}, "http(s) URL"),
    ({"url": 42}, "http(s) URL"),
    ({"url": None}, "http(s) URL"),
    ({"node_id": ""}, "non-empty string"),
    ({"node_id": 5}, "non-empty string"),
    ({"node_id": "a b"}, "may hold only"),
    ({"node_id": "x" * 129}, "longer than"),
    ({"model": None}, "'model'"),
    ({"model": "m\x00evil"}, "control characters"),
    ({"queue": -1}, "'queue' must be in"),
    ({"queue": "many"}, "integer"),
    ({"rep": 1.5}, "'rep' must be in"),
    ({"rep": -0.1}, "'rep' must be in"),
]


@pytest.mark.parametrize(("change", "fragment"), BAD)
def test_parse_node_rejects(change: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InvalidNodeError) as info:
        parse_node({**VALID, **change})
    assert fragment in str(info.value)


@pytest.mark.parametrize("data", [[], "node", None, 7])
def test_parse_node_rejects_non_objects(data: Any) -> None:
    with pytest.raises(InvalidNodeError, match="JSON object"):
        parse_node(data)


def test_parse_node_accepts_txt_strings_and_defaults() -> None:
    rec = parse_node({"node_id": "cpu", "model": "m", "start": "0", "end": " 39 ", "layers": "40",
                      "url": "https://cpu.test:8443/base/", "tps": "12.5"}, now=7.0)
    assert rec == NodeRecord("cpu", "m", 0, 39, 40, "https://cpu.test:8443/base", 12.5, 0, 1.0, 7.0)
    assert parse_node({**VALID, "start": 0.0}).start == 0


def test_effective_tps_is_queue_adjusted_times_reputation() -> None:
    assert node("a", 0, 39, tps=30.0, queue=2, rep=0.5).effective_tps == pytest.approx(5.0)


TOPOLOGY_STEPS = [  # (operation, record or id, expected result, epoch after, version bumped)
    ("upsert", node("a", 0, 21, tps=50.0), "join", 1, True),
    ("upsert", node("a", 0, 21, tps=50.0), "refresh", 1, False),  # heartbeat
    ("upsert", node("a", 0, 21, tps=40.0, queue=3), "refresh", 1, True),  # load changed
    ("upsert", node("a", 0, 19, tps=40.0), "shard-change", 2, True),
    ("upsert", node("a", 0, 19, tps=40.0, url="http://moved.test"), "shard-change", 3, True),
    ("upsert", node("b", 20, 39), "join", 4, True),
    ("remove", "b", True, 5, True),
    ("remove", "b", False, 5, False),
]


def test_topology_epochs_and_versions(clock: Any) -> None:
    topo = Topology()
    for op, arg, expected, epoch, bumped in TOPOLOGY_STEPS:
        clock.advance(10.0)
        before = topo.model("m").version if topo.model("m") else 0
        result = topo.upsert(arg, clock()) if op == "upsert" else topo.remove(arg, clock())
        model = topo.model("m")
        assert model is not None
        assert (result, model.epoch) == (expected, epoch), (op, arg)
        assert (model.version > before) == bumped, (op, arg)
        if epoch != 0 and bumped and result != "refresh":
            assert model.changed_at == clock()


def test_refresh_keeps_change_time_and_updates_seen_at(clock: Any) -> None:
    topo = Topology()
    topo.upsert(node("a", 0, 39), clock())
    changed = topo.model("m").changed_at
    clock.advance(30.0)
    assert topo.upsert(node("a", 0, 39), clock()) == "refresh"
    assert topo.model("m").changed_at == changed
    assert topo.model("m").nodes["a"].seen_at == clock()


def test_node_moving_to_another_model_leaves_the_first(clock: Any) -> None:
    topo = Topology()
    topo.upsert(node("a", 0, 39), clock())
    clock.advance(1.0)
    assert topo.upsert(node("a", 0, 11, layers=12, model="small"), clock()) == "join"
    assert topo.models() == ["small"]
    assert topo.model("m") is None  # its last node left: the empty model is forgotten
    assert [n.node_id for n in topo.nodes()] == ["a"]


def test_note_change_adopts_only_newer_changes(clock: Any) -> None:
    topo = Topology()
    for node_id in ("b", "c"):
        topo.upsert(node(node_id, 0, 39), clock())
    epoch = topo.model("m").epoch
    topo.note_change("m", clock() - 100.0)  # older than ours: ignored
    assert topo.model("m").epoch == epoch
    topo.note_change("m", clock() + 1.0)  # a newer change learned by gossip
    assert topo.model("m").epoch == epoch + 1
    assert topo.model("m").changed_at == clock() + 1.0
