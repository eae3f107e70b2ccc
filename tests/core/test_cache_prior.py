"""A server's own prefix-cache report: bounded as hostile input, a prior the router's own
samples override (core/cache_prior.py)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from meshroute_middleware.core import InvalidNodeError, NodeRecord, Outcome, Router, parse_node
from meshroute_middleware.core.cache_prior import (
    PRIOR_SAMPLES,
    CachePrior,
    prior_warm_tokens,
    route_prior,
)
from meshroute_middleware.core.contracts.txt import decode_node, encode_node
from meshroute_middleware.core.policies.cache_rules import LeastLoadedPolicy
from meshroute_middleware.core.prefix import chain

BASE = {"node_id": "a", "model": "m", "start": 0, "end": 31, "layers": 32,
        "url": "http://a.test", "tps": 10.0}


def test_a_record_carries_its_servers_cache_report_both_ways() -> None:
    record = parse_node({**BASE, "cache_hit": 0.6, "cache_tokens": 4210})
    assert record.cache == CachePrior(0.6, 4210)
    assert parse_node(record.to_dict()) == record
    props = encode_node(record, "s3cret")
    assert props["ch"] == "0.6" and props["ck"] == "4210"
    assert decode_node(props, secret="s3cret") == record
    plain = parse_node(BASE)  # a node whose server exports nothing: no keys, no prior
    assert plain.cache is None and "ch" not in encode_node(plain)
    assert "cache_hit" not in plain.to_dict()


@pytest.mark.parametrize(("fields", "fragment"), [
    ({"cache_hit": 1.5}, "cache_hit"),
    ({"cache_hit": -0.1}, "cache_hit"),
    ({"cache_hit": "nan"}, "finite"),
    ({"cache_hit": True}, "boolean"),
    ({"cache_hit": "0.5" * 40}, "number"),
    ({"cache_hit": "٠.5"}, "number"),  # non-ASCII digits float() would take
    ({"cache_tokens": -1}, "cache_tokens"),
    ({"cache_tokens": 12.5}, "integer"),
    ({"cache_tokens": 10**12}, "cache_tokens"),
    ({"cache_tokens": [1]}, "finite number"),
    ({"cache_tokens": 10**400}, "range"),  # JSON's big integers: no OverflowError
    ({"cache_hit": 10**400}, "range"),
])
def test_a_hostile_cache_field_rejects_the_record(fields: dict[str, Any],
                                                  fragment: str) -> None:
    with pytest.raises(InvalidNodeError, match=fragment):
        parse_node({**BASE, **fields})


def test_a_hostile_cache_field_in_a_txt_record_is_rejected() -> None:
    props = encode_node(parse_node(BASE))
    with pytest.raises(InvalidNodeError, match="cache_hit"):
        decode_node({**props, "ch": "7"})


def test_a_chain_is_warm_only_where_every_hop_holds_the_prefix() -> None:
    assert route_prior([None, None]) is None
    assert route_prior([CachePrior(0.9, 5000), None, CachePrior(0.5, None)]) == \
        CachePrior(0.5, 5000)
    assert route_prior([CachePrior(None, 300)]) == CachePrior(None, 300)


def test_the_prior_fades_as_the_routes_own_samples_arrive() -> None:
    small = CachePrior(None, 2000)  # its slots hold at most 2,000 tokens
    assert prior_warm_tokens(small, 5000, 0) == 2000
    assert prior_warm_tokens(small, 5000, PRIOR_SAMPLES) == 3500
    assert prior_warm_tokens(small, 5000, 99 * PRIOR_SAMPLES) == 4970
    assert prior_warm_tokens(None, 5000, 0) == 5000
    assert prior_warm_tokens(CachePrior(1.0, None), 5000, 0) == 5000
    assert prior_warm_tokens(CachePrior(0.0, None), 5000, 0) == 5000  # a rate: not this prefix
    assert prior_warm_tokens(small, 0, 0) == 0
    values = [prior_warm_tokens(small, 5000, n) for n in range(50)]
    assert values == sorted(values) and not math.isclose(values[0], values[-1])


def test_the_router_tempers_a_warm_route_by_its_servers_report() -> None:
    seen: list[dict[str, int]] = []

    class Spy(LeastLoadedPolicy):
        def choose(self, arms, now, rng):  # type: ignore[no-untyped-def]
            seen.append({a.signature: a.warm_tokens for a in arms})
            return super().choose(arms, now, rng)

    def build(cache_a: CachePrior | None) -> Router:
        router = Router(clock=lambda: 0.0, policy=Spy())
        router.upsert_node(NodeRecord("a", "m", 0, 31, 32, "http://a.test", 10.0,
                                      cache=cache_a))
        return router

    warm: dict[str, list[int]] = {}
    for label, cache in (("none", None), ("small", CachePrior(0.0, 200))):
        router = build(cache)
        for i in range(12):  # a new conversation each time; the route's own samples grow
            turn1 = chain([b"system", b"user %d" % i], [800, 100])
            turn2 = turn1.extended(b"answer", 50).extended(b"user 2", 30)
            router.record(router.choose("m", prefix=turn1), Outcome(50, 2.0, 1.0))
            d = router.choose("m", prefix=turn2)
            warm.setdefault(label, []).append(seen[-1]["m|a[0-31]"])
            router.record(d, Outcome(50, 2.0, 1.0))
    assert warm["none"] == [950] * 12  # no report: exactly as before
    # slots of 200 tokens: little credited at first, then the route's own samples take over
    assert warm["small"][0] < 950 / 2
    assert warm["small"] == sorted(warm["small"]) and warm["small"][-1] > 700
