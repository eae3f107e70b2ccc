"""The Router facade: decisions, pins, fallback chain, in-flight, statuses, routing table."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from meshroute_middleware.core import (
    InvalidPinError,
    NodeRecord,
    NoRouteError,
    Outcome,
    Router,
    RouterConfig,
    UnknownModelError,
)

from ..conftest import route_view

H = 600.0
ADR = "adr0021"  # named, so that a change of the default policy does not change these tests
HYBRID, SOLO = "m|gpu[0-21]->cpu[22-39]", "m|cpu[0-39]"
GOOD = Outcome(completion_tokens=100, seconds=2.0, ttfb_s=0.25)  # 50 tok/s


def node(node_id: str, start: int, end: int, **kw: Any) -> NodeRecord:
    return NodeRecord(node_id, "m", start, end, 40, f"http://{node_id}.test", **kw)


def mixed(clock: Any, **config: Any) -> Router:
    """ADR-0020's topology: a fast GPU node 0–21 and a slow CPU node 0–39."""
    router = Router(RouterConfig(**{"policy": ADR, **config}), clock=clock,
                    rng=random.Random(11))
    router.upsert_node(node("gpu", 0, 21, tps=50.0))
    router.upsert_node(node("cpu", 0, 39, tps=12.0))
    clock.advance(1.0)
    return router


def flying(router: Router, signature: str) -> int:
    """Requests in flight on a route, as the routing table shows them."""
    rows = router.routing_table("m")["models"]["m"]["candidates"]
    return sum(row["in_flight"] for row in rows if row["signature"] == signature)


def measure(router: Router, clock: Any, pin: list[str], outcome: Outcome = GOOD) -> str:
    decision = router.choose("m", pin=pin)
    clock.advance(1.0)
    return router.record(decision, outcome)


def test_head_is_always_the_route_head_and_hop_two_starts_at_22(clock: Any) -> None:
    router = mixed(clock, explore_share=0.5)
    measure(router, clock, ["cpu"], Outcome(60, 2.0))
    seen = set()
    for _ in range(200):
        d = router.choose("m")
        route = d.route
        assert route.head is route.hops[0].node
        if d.signature == HYBRID:
            assert [h.start_layer for h in route.hops] == [0, 22]
        seen.add(d.signature)
        router.record(d, GOOD)
        clock.advance(0.5)
    assert seen == {HYBRID, SOLO}


def test_cold_start_is_greedy_best_prior(clock: Any) -> None:
    router = mixed(clock)
    router.upsert_node(node("cpu", 0, 39, tps=12.0, queue=1))  # hybrid prior 6, solo 6
    router.upsert_node(node("gpu", 0, 21, tps=50.0, queue=0))
    d = router.choose("m")
    assert (d.mode, d.attempt) == ("greedy-fallback", 0)
    assert d.model == "m" and d.signature == d.route.signature


def test_pinned_routes_bypass_the_bandit_and_still_record(clock: Any) -> None:
    router = mixed(clock)
    state = router.rng.getstate()
    d = router.choose("m", pin=["gpu", "cpu"])
    assert (d.mode, d.signature, d.ranked) == ("pinned", HYBRID, ())
    assert router.rng.getstate() == state
    assert router.record(d, GOOD) == "sample"
    assert route_view(router.stats, "m", HYBRID, clock()).count == 1
    assert router.fallback(d) is None  # a pin has no fallback chain


@pytest.mark.parametrize(("pin", "fragment"), [
    (["ghost"], "node 'ghost'"),
    (["gpu", "gpu"], "must start at layer 22"),
    (["gpu"], "stops at layer 21"),
])
def test_invalid_pins(clock: Any, pin: list[str], fragment: str) -> None:
    with pytest.raises(InvalidPinError, match=fragment):
        mixed(clock).choose("m", pin=pin)


def test_unknown_model_and_no_route(clock: Any) -> None:
    router = Router(clock=clock)
    with pytest.raises(UnknownModelError):
        router.choose("m")
    router.upsert_node(node("a", 0, 9))
    router.upsert_node(node("b", 15, 39))
    with pytest.raises(NoRouteError) as info:
        router.choose("m")
    assert info.value.reasons == {"a": "no chain of nodes from this head reaches the last layer"}
    router.remove_node("a")
    with pytest.raises(NoRouteError) as info:
        router.choose("m")
    assert info.value.reasons == {"*": "no node serves layer 0 of 'm'"}


@pytest.mark.parametrize(("tokens", "seconds", "expected"), [
    (8, 1.0, "sample"), (7, 1.0, "success"), (0, 1.0, "success"), (100, 0.0, "success"),
    (100, math.nan, "success"), (100, math.inf, "success"), (100, -1.0, "success"),
])
def test_near_empty_and_unmeasurable_completions_are_no_samples(
        clock: Any, tokens: int, seconds: float, expected: str) -> None:
    router = mixed(clock)
    assert measure(router, clock, ["cpu"], Outcome(tokens, seconds)) == expected
    view = route_view(router.stats, "m", SOLO, clock())
    assert view.count == (expected == "sample") and view.ok == pytest.approx(1.0)
    if expected == "sample":
        assert view.tps == pytest.approx(8.0)


def test_status_lifecycle_through_topology_changes(clock: Any) -> None:
    router = mixed(clock)
    rows = router.routing_table()["models"]["m"]["candidates"]
    assert {r["signature"]: r["status"] for r in rows} == {HYBRID: "unsampled", SOLO: "unsampled"}

    def status_of(sig: str) -> str:
        return next(a.view.status for a in router.arms("m") if a.signature == sig)

    measure(router, clock, ["cpu"])
    assert status_of(SOLO) == "proven"
    for change in [lambda: router.upsert_node(node("x", 0, 39, tps=1.0)),  # join
                   lambda: router.remove_node("x"),  # leave
                   lambda: router.upsert_node(node("gpu", 0, 19, tps=50.0))]:  # shard change
        clock.advance(1.0)
        change()
        clock.advance(1.0)
        assert status_of(SOLO) == "stale"
        assert measure(router, clock, ["cpu"], Outcome(30, 1.0)) == "sample"
        assert status_of(SOLO) == "proven"
        assert route_view(router.stats, "m", SOLO, clock()).count == 1  # the new sample alone
    clock.advance(1.0)
    router.upsert_node(node("cpu", 0, 39, tps=99.0, queue=4))  # a load refresh: not stale
    assert status_of(SOLO) == "proven"
    clock.advance(2 * H)  # mass 1 → 0.25 < 0.5
    assert status_of(SOLO) == "decayed"
    clock.advance(24 * 3600)
    assert router.prune() == 1
    assert status_of(SOLO) == "unsampled"


def test_fallback_chain_order(clock: Any) -> None:
    router = Router(RouterConfig(ADR, explore_share=0.0), clock=clock, rng=random.Random(5))
    for name, prior in [("a", 100.0), ("b", 20.0), ("c", 10.0), ("d", 11.0)]:
        router.upsert_node(node(name, 0, 39, tps=prior))
    clock.advance(1.0)
    measure(router, clock, ["c"], Outcome(30, 1.0))  # proven at 30 tok/s
    measure(router, clock, ["d"], Outcome(50, 1.0))  # proven at 50 tok/s
    order = ["m|d[0-39]", "m|c[0-39]", "m|a[0-39]", "m|b[0-39]"]  # proven by tps, then prior
    for _ in range(20):
        d = router.choose("m")
        assert d.mode == "exploit" and d.signature in order[:2]
        chain = [d.signature]
        while (nxt := router.fallback(d)) is not None:
            assert (nxt.mode, nxt.attempt) == ("fallback", d.attempt + 1)
            router.record(d, Outcome(error="connect"))
            d = nxt
            chain.append(d.signature)
        assert chain[1:] == [s for s in order if s != chain[0]]
        router.cancel(d)
        assert all(flying(router, s) == 0 for s in order)


def test_in_flight_counting(clock: Any) -> None:
    router = mixed(clock)
    first, second = router.choose("m"), router.choose("m")
    assert first.signature == second.signature == SOLO  # greedy: same route
    assert flying(router, SOLO) == 2
    assert {a.signature: a.in_flight for a in router.arms("m")} == {SOLO: 2, HYBRID: 0}
    router.record(first, GOOD)
    router.record(first, GOOD)  # a duplicate end must not release the other request
    assert flying(router, SOLO) == 1
    router.cancel(second)
    router.cancel(second)
    assert flying(router, SOLO) == 0
    fb = router.fallback(router.choose("m"))
    assert fb is not None and flying(router, HYBRID) == 1 and flying(router, SOLO) == 1


def test_routing_table_shape(clock: Any) -> None:
    router = mixed(clock, explore_share=0.25)
    measure(router, clock, ["cpu"], Outcome(40, 2.0, 0.5))
    measure(router, clock, ["gpu", "cpu"], Outcome(40, 1.0, 0.1))
    table = router.routing_table()
    assert set(table) == {"config", "models"}
    assert table["config"] == RouterConfig(ADR, explore_share=0.25).to_dict()
    assert list(table["models"]) == ["m"] and table["models"]["m"]["epoch"] == 2
    rows = {r["signature"]: r for r in table["models"]["m"]["candidates"]}
    assert set(rows) == {HYBRID, SOLO}
    for row in rows.values():
        assert {"signature", "hops", "tps", "prior_tps", "coefficient", "share", "samples",
                "weight", "status"} <= set(row)
    hybrid, solo = rows[HYBRID], rows[SOLO]
    assert hybrid["hops"] == [{"node_id": "gpu", "start_layer": 0, "end_layer": 21},
                              {"node_id": "cpu", "start_layer": 22, "end_layer": 39}]
    assert (hybrid["tps"], solo["tps"]) == (pytest.approx(40.0), pytest.approx(20.0))
    assert (hybrid["coefficient"], solo["coefficient"]) == (1.0, pytest.approx(0.5))
    assert (hybrid["share"], solo["share"]) == (pytest.approx(2 / 3), pytest.approx(1 / 3))
    assert hybrid["prior_tps"] == 12.0 and hybrid["samples"] == 1 and hybrid["status"] == "proven"
    assert hybrid["weight"] == pytest.approx(1.0) and solo["ttfb_ms"] == pytest.approx(500.0)
    assert router.routing_table("nope")["models"] == {
        "nope": {"epoch": 0, "share_basis": "policy", "candidates": []}}


def test_enumeration_is_cached_until_the_topology_changes(clock: Any) -> None:
    router = mixed(clock)
    first = router.candidates("m")
    router.choose("m")
    router.upsert_node(node("cpu", 0, 39, tps=12.0))  # heartbeat: unchanged record
    assert router.candidates("m") is first
    router.upsert_node(node("cpu", 0, 39, tps=6.0))  # throughput changed: new priors
    assert router.candidates("m") is not first
    assert router.candidates("m")[0].prior_tps == 6.0
    assert router.candidates("unknown") == () and router.arms("unknown") == []


def test_learned_split_end_to_end(clock: Any) -> None:
    """Rates learned through record() split 4,000 seeded decisions 0.6 / 0.4 (±0.03: ~4 sd)."""
    router = Router(RouterConfig(ADR, explore_share=0.3, weight_alpha=1.0), clock=clock,
                    rng=random.Random(2024))
    router.upsert_node(node("fast", 0, 39, tps=1.0))
    router.upsert_node(node("slow", 0, 39, tps=99.0))  # the prior must not matter once proven
    clock.advance(1.0)
    measure(router, clock, ["fast"], Outcome(60, 1.0))
    measure(router, clock, ["slow"], Outcome(40, 1.0))
    fast = 0
    for _ in range(4000):
        d = router.choose("m")
        assert d.mode == "exploit"
        fast += d.signature == "m|fast[0-39]"
        router.cancel(d)
    assert fast / 4000 == pytest.approx(0.6, abs=0.03)


def test_load_aware_shares_are_the_recent_split_not_one_snapshot(clock: Any) -> None:
    """A load-aware policy's next pick depends on what is in flight; its table shares the
    traffic as the last attempts did (Monte Carlo only until there are enough of them)."""
    router = Router(RouterConfig(policy="thompson"), clock=clock, rng=random.Random(5))
    router.upsert_node(node("a", 0, 39, tps=30.0))
    router.upsert_node(node("b", 0, 39, tps=20.0))
    assert router.routing_table("m")["models"]["m"]["share_basis"] == "sampled"
    open_decisions = [router.choose("m") for _ in range(40)]  # 40 concurrent requests
    picked = {d.signature for d in open_decisions}
    doc = router.routing_table("m")["models"]["m"]
    assert doc["share_basis"] == "recent"
    shares = {row["signature"]: row["share"] for row in doc["candidates"]}
    assert sum(shares.values()) == pytest.approx(1.0)
    weights = [0.5 ** (age / 32) for age in range(40)]  # the newest attempt weighs 1
    for sig in shares:
        expected = sum(w for d, w in zip(reversed(open_decisions), weights, strict=True)
                       if d.signature == sig) / sum(weights)
        assert shares[sig] == pytest.approx(expected)
    assert len(picked) == 2  # in-flight load spread them over both routes


def test_recent_shares_follow_a_change_within_a_few_dozen_attempts(clock: Any) -> None:
    """After 200 attempts on one route and 48 on another, the shown split already gives the
    new route most of the traffic (a plain count of the last 256 would say 19 %)."""
    router = Router(RouterConfig(policy="thompson"), clock=clock, rng=random.Random(5))
    router.upsert_node(node("a", 0, 39, tps=30.0))
    router.upsert_node(node("b", 0, 39, tps=20.0))
    for head, n in (("a", 200), ("b", 48)):
        for _ in range(n):
            router.cancel(router.choose("m", pin=[head]))
    shares = {row["head"]: row["share"]
              for row in router.routing_table("m")["models"]["m"]["candidates"]}
    assert shares["b"] == pytest.approx(1 - 0.5 ** (48 / 32), rel=0.01)  # 0.65
    assert shares["b"] > 0.6 > 48 / 248


def test_the_requests_max_tokens_reaches_the_policy_and_its_outcome(clock: Any) -> None:
    seen: list[tuple[str, int | None]] = []

    class Spy:
        name = "spy"

        def choose(self, arms: Any, now: float, rng: random.Random) -> tuple[int, str]:
            seen.append(("choose", arms[0].max_tokens))
            return 0, "exploit"

        def observe(self, signature: str, outcome: Outcome, now: float) -> None:
            seen.append(("observe", outcome.max_tokens))

    router = Router(RouterConfig(policy=ADR), clock=clock, rng=random.Random(1),
                    policy=Spy())  # type: ignore[arg-type]
    router.upsert_node(node("gpu", 0, 21, tps=50.0))
    router.upsert_node(node("cpu", 0, 39, tps=12.0))
    decision = router.choose("m", max_tokens=128)
    assert decision.max_tokens == 128
    fallback = router.fallback(decision)
    assert fallback is not None and fallback.max_tokens == 128
    router.record(decision, GOOD)
    router.record(router.choose("m"), GOOD)
    assert seen == [("choose", 128), ("observe", 128), ("choose", None), ("observe", None)]
