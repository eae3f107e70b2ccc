"""Capabilities: node and provider-model declarations, route capabilities, filtered choices."""

from __future__ import annotations

import random
from typing import Any

import pytest

from meshroute_middleware.core import InvalidNodeError, NodeRecord, Router, RouterConfig
from meshroute_middleware.core.capabilities import (
    CAPABILITIES,
    DEFAULT_CAPS,
    UnsupportedCapabilityError,
    format_caps,
    parse_caps,
)
from meshroute_middleware.core.errors import NoRouteError
from meshroute_middleware.core.providers.config import (
    ProviderConfigError,
    parse_providers_config,
)
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.core.routes import enumerate_routes
from meshroute_middleware.core.topology import parse_node

from .providers.conftest import MESH, T0, doc

VISION = frozenset({"vision"})


def record(node_id: str = "a", **kw: Any) -> dict[str, Any]:
    return {"node_id": node_id, "model": "m", "start": 0, "end": 39, "layers": 40,
            "url": f"http://{node_id}.test", **kw}


def node(node_id: str, start: int, end: int, caps: frozenset[str] = DEFAULT_CAPS,
         **kw: Any) -> NodeRecord:
    return NodeRecord(node_id, "m", start, end, 40, f"http://{node_id}.test", caps=caps, **kw)


def test_the_names_are_the_contract() -> None:
    assert CAPABILITIES == ("vision", "tools", "json_schema", "embeddings", "completions")


@pytest.mark.parametrize(("value", "caps"), [
    (["vision", "tools"], {"vision", "tools"}),
    ("vision,tools", {"vision", "tools"}),
    ("json_schema, embeddings", {"json_schema", "embeddings"}),
    ([], set()),
    ("", set()),
])
def test_parse_caps(value: object, caps: set[str]) -> None:
    assert parse_caps(value) == frozenset(caps)


@pytest.mark.parametrize("value", [["telepathy"], "vision,sudo", 3, {"vision": 1},
                                   "v" * 500, ["vision"] * 6])
def test_parse_caps_refuses_what_it_does_not_know(value: object) -> None:
    with pytest.raises(ValueError):
        parse_caps(value)


def test_format_caps_is_in_contract_order() -> None:
    assert format_caps({"tools", "vision"}) == "vision,tools"


def test_a_node_without_caps_gets_the_defaults() -> None:
    assert parse_node(record()).caps == DEFAULT_CAPS == {"tools", "json_schema"}


def test_a_node_declares_caps_and_to_dict_carries_them() -> None:
    n = parse_node(record(caps=["vision", "tools"]))
    assert n.caps == {"vision", "tools"}
    assert n.to_dict()["caps"] == ["vision", "tools"]
    assert parse_node(n.to_dict()) == n  # the shape POST /v1/nodes accepts


def test_a_node_with_an_unknown_cap_is_refused() -> None:
    with pytest.raises(InvalidNodeError, match="unknown capability"):
        parse_node(record(caps=["vision", "\x1b[31mroot"]))


def test_a_route_has_what_every_hop_has() -> None:
    a = node("a", 0, 19, frozenset({"vision", "tools"}))
    b = node("b", 20, 39, frozenset({"vision"}))
    (route,) = enumerate_routes("m", [a, b])
    assert route.caps == {"vision"}


def test_enumeration_with_needs_uses_only_nodes_that_have_them() -> None:
    # The greedy tail over all nodes picks the fast text-only tail; with vision needed the
    # slower vision tail forms the route instead.
    head = node("head", 0, 19, frozenset({"vision"}))
    fast = node("fast", 20, 39, frozenset(), tps=90.0)
    slow = node("slow", 20, 39, VISION, tps=5.0)
    (plain,) = enumerate_routes("m", [head, fast, slow])
    assert plain.node_ids == ("head", "fast")
    (seeing,) = enumerate_routes("m", [head, fast, slow], needs=VISION)
    assert seeing.node_ids == ("head", "slow")


def router(clock: Any, *nodes: NodeRecord) -> Router:
    r = Router(RouterConfig(policy="adr0021"), clock=clock, rng=random.Random(3))
    for n in nodes:
        r.upsert_node(n)
    return r


def test_choose_skips_routes_without_what_the_request_needs(clock: Any) -> None:
    r = router(clock, node("text", 0, 39, DEFAULT_CAPS, tps=100.0),
               node("eyes", 0, 39, frozenset({"vision", "tools"}), tps=1.0))
    for _ in range(50):
        d = r.choose("m", needs=VISION)
        assert d.route.head.node_id == "eyes"
        assert d.ranked == ()  # the text-only route is no fallback either
        r.cancel(d)
    seen = {r.choose("m").route.head.node_id for _ in range(50)}
    assert "text" in seen  # without needs, both are candidates


def test_choose_raises_unsupported_capability_naming_it(clock: Any) -> None:
    r = router(clock, node("text", 0, 39, frozenset({"tools"})))
    with pytest.raises(UnsupportedCapabilityError, match="vision") as info:
        r.choose("m", needs=frozenset({"vision", "tools"}))
    assert info.value.missing == ("vision",)
    with pytest.raises(UnsupportedCapabilityError):
        r.choose("m", pin=["text"], needs=VISION)
    assert r.serves("m", frozenset({"tools"})) and not r.serves("m", VISION)


def test_a_gap_is_still_no_route_not_a_capability(clock: Any) -> None:
    r = router(clock, node("half", 0, 19, VISION))
    with pytest.raises(NoRouteError) as info:
        r.choose("m", needs=VISION)
    assert not isinstance(info.value, UnsupportedCapabilityError)


def test_a_caps_change_is_seen_by_the_next_choice(clock: Any) -> None:
    r = router(clock, node("a", 0, 39, frozenset()))
    assert not r.serves("m", VISION)
    r.upsert_node(node("a", 0, 39, VISION))
    assert r.choose("m", needs=VISION).route.head.node_id == "a"


def provider_doc(**model: Any) -> dict[str, Any]:
    d = doc()
    d["providers"][0]["models"][0].update(model)
    return d


def test_provider_models_declare_capabilities() -> None:
    cfg = parse_providers_config(provider_doc(capabilities=["vision", "tools", "json_schema"]))
    big = cfg.providers[0].model("big-model")
    assert big is not None and big.capabilities == {"vision", "tools", "json_schema"}
    small = cfg.providers[1].model("small-model")
    assert small is not None and small.capabilities == DEFAULT_CAPS


@pytest.mark.parametrize("value", [["x-ray"], "vision", [1]])
def test_provider_capabilities_are_validated(value: object) -> None:
    with pytest.raises(ProviderConfigError, match="capabilities"):
        parse_providers_config(provider_doc(capabilities=value))


def test_rank_keeps_only_the_routes_with_the_capability() -> None:
    cfg = parse_providers_config(provider_doc(capabilities=["vision"]))
    pr = ProviderRouter(cfg)
    res = pr.resolve("auto:fast", MESH)
    ranked = [s.candidate.route for s in pr.rank(res, T0, needs=VISION,
                                                 mesh_serves=lambda m, n: m == "qwen")]
    assert sorted(ranked) == ["fastco/big-model", "qwen"]
    passed = pr.incapable(res, VISION, lambda m, n: m == "qwen")
    assert {p.route for p in passed} == {"fastco/huge-model", "slowco/small-model", "llama"}
    assert {p.reason for p in passed} == {"capability"}
    everything = [s.candidate.route for s in pr.rank(res, T0)]
    assert len(everything) == 5


def test_rank_with_no_capable_route_raises() -> None:
    pr = ProviderRouter(parse_providers_config(doc()))
    res = pr.resolve("auto:fast", MESH)
    with pytest.raises(UnsupportedCapabilityError, match="vision"):
        pr.incapable(res, VISION, lambda m, n: False)
    with pytest.raises(UnsupportedCapabilityError):
        pr.rank(res, T0, pinned="fastco/big-model", needs=VISION)
