"""The simulator itself: analytic throughput, real queueing, noise, failures, events."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

from meshroute_middleware.core.sim.engine import Simulator
from meshroute_middleware.core.sim.metrics import throughput
from meshroute_middleware.core.sim.model import (
    MODEL,
    Event,
    NodeSpec,
    Scenario,
    batching,
    serial,
    whole,
)
from meshroute_middleware.core.sim.oracle import best_split
from meshroute_middleware.core.sim.workload import FIXED_CAP, draw_requests

from ...conftest import stat_keys


def quiet(name: str, nodes: tuple[NodeSpec, ...], requests: int = 200, **kw: object) -> Scenario:
    """A scenario without noise unless asked."""
    kw.setdefault("noise_sigma", 0.0)
    return Scenario(name, name, nodes, requests, **kw)  # type: ignore[arg-type]


def test_oracle_throughput_matches_the_analytic_value_without_queues() -> None:
    # One client, no noise: the oracle always takes the 60 tok/s route, so delivered
    # tokens/s is exactly 60 (requests back to back, no waiting).
    sim = Simulator(quiet("s", (whole("fast", 60.0), whole("slow", 40.0))), "oracle", 1)
    trace = sim.run()
    assert throughput(trace) == pytest.approx(60.0, rel=1e-9)
    assert all(trace.good)


def test_service_time_sums_every_hop_and_the_hop_latency() -> None:
    head = NodeSpec("head", 0, 15, 32, 1.0 / (100.0 * 16), latency_s=0.5)
    tail = NodeSpec("tail", 16, 31, 32, 1.0 / (50.0 * 16), latency_s=0.25)
    sim = Simulator(quiet("s", (head, tail), hop_token_s=0.01), "oracle", 2)
    trace = sim.run()
    tokens = [r.tokens for r in sim.requests]
    per_token = 1 / 100 + 1 / 50 + 0.01  # both shards plus one hop boundary
    expected = [t * per_token + 0.75 for t in tokens]
    got = [f - a for a, f in zip(trace.arrival_s, trace.finish_s, strict=True)]
    assert got == pytest.approx(expected, rel=1e-9)


def test_a_single_slot_node_queues() -> None:
    node = whole("only", 50.0, slots=1)
    sim = Simulator(quiet("s", (node,), requests=100, clients=4), "thompson", 3)
    trace = sim.run()
    service = [r.tokens / 50.0 for r in sim.requests]
    latency = [f - a for a, f in zip(trace.arrival_s, trace.finish_s, strict=True)]
    # Four clients share one slot: most requests wait for others, and the node never runs
    # two at once, so throughput is the node's own speed.
    waited = sum(lat > s + 1e-9 for lat, s in zip(latency, service, strict=True))
    assert waited >= 90
    assert throughput(trace) == pytest.approx(50.0, rel=1e-9)
    spans = sorted(zip([f - s for f, s in zip(trace.finish_s, service, strict=True)],
                       trace.finish_s, strict=True))
    assert all(b[0] >= a[1] - 1e-9 for a, b in itertools.pairwise(spans))


def test_two_slots_serve_two_at_once() -> None:
    node = whole("only", 50.0, slots=2)
    trace = Simulator(quiet("s", (node,), requests=100, clients=2), "adr0021", 3).run()
    assert throughput(trace) == pytest.approx(100.0, rel=0.02)  # tail: one client finishes first


def test_noise_has_the_configured_sigma_and_mean_one() -> None:
    scenario = Scenario("n", "n", (whole("a", 50.0),), 20000, noise_sigma=0.5)
    noise = [r.noise for r in draw_requests(scenario, random.Random(4))]
    # sd of a sample sd over 20,000 draws is 0.5/sqrt(40,000) = 0.0025: ±0.015 is 6 sd;
    # the mean of a mean-one log-normal has sd ~0.0038: ±0.02 is ~5 sd.
    assert statistics.pstdev(math.log(x) for x in noise) == pytest.approx(0.5, abs=0.015)
    assert statistics.fmean(noise) == pytest.approx(1.0, abs=0.02)


def test_failures_happen_at_the_configured_rate_and_cost_time() -> None:
    scenario = quiet("f", (whole("a", 50.0, fail_rate=0.2),), requests=3000)
    trace = Simulator(scenario, "oracle", 5).run()
    # Binomial sd at 3,000 requests is 0.0073: ±0.03 is 4 sd.
    assert sum(trace.failed) / 3000 == pytest.approx(0.2, abs=0.03)
    assert all(t == 0 for t, f in zip(trace.tokens_ok, trace.failed, strict=True) if f)
    assert all(f > a for a, f in zip(trace.arrival_s, trace.finish_s, strict=True))


def test_poisson_arrivals_have_the_configured_rate() -> None:
    scenario = quiet("p", (whole("a", 1000.0, slots=64),), requests=4000, poisson_rate=2.0)
    trace = Simulator(scenario, "oracle", 6).run()
    # 4,000 exponential gaps of mean 0.5 s: the mean has sd 0.0079 s; ±0.03 s is ~4 sd.
    assert trace.arrival_s[-1] / 3999 == pytest.approx(0.5, abs=0.03)


def test_a_slow_event_changes_the_truth_and_the_oracle_follows() -> None:
    scenario = quiet("d", (whole("a", 60.0), whole("b", 50.0)), requests=400,
                     events=(Event(200, "slow", "a", factor=2.0),))
    sim = Simulator(scenario, "oracle", 7)
    trace = sim.run()
    heads = {sim.requests[i].nodes[0] for i in range(200)}
    assert heads == {"a"}
    assert {sim.requests[i].nodes[0] for i in range(200, 400)} == {"b"}
    assert all(trace.good)


def test_leave_and_join_go_through_the_router() -> None:
    scenario = quiet("c", (whole("a", 60.0), whole("b", 50.0)), requests=300,
                     events=(Event(100, "leave", "a"), Event(200, "join", "a",
                                                             node=whole("a", 60.0))))
    sim = Simulator(scenario, "thompson", 8)
    sim.run()
    assert {sim.requests[i].nodes[0] for i in range(100, 200)} == {"b"}
    topo = sim.router.topology.model(MODEL)
    assert topo is not None and topo.epoch == 4  # two joins at start, a leave, a join
    assert stat_keys(sim.router.stats, MODEL)  # outcomes were recorded in the real store


def test_same_seed_same_workload_for_every_policy() -> None:
    scenario = quiet("w", (whole("a", 60.0), whole("b", 40.0)), noise_sigma=0.3)
    a, b = Simulator(scenario, "adr0021", 9), Simulator(scenario, "petals", 9)
    assert [(r.tokens, r.noise) for r in a.requests] == [(r.tokens, r.noise) for r in b.requests]


def test_nodes_announce_their_queue_depth_to_the_router() -> None:
    scenario = quiet("q", (whole("a", 60.0, slots=1),), requests=10, announce_s=1.0)
    sim = Simulator(scenario, "petals", 10)
    sim.nodes["a"].queued = 3
    sim._announce()
    [record] = [n for n in sim.router.topology.nodes() if n.node_id == "a"]
    assert record.queue == 3
    assert record.effective_tps == pytest.approx(record.tps / 4)


def test_a_batch_slows_every_request_in_it() -> None:
    # One node, 4 slots, each neighbour costs 25 %: with 4 clients every request runs at
    # 60 / 1.75 tok/s and the node delivers 4 × that (tails aside: 400 requests).
    node = batching("b", 60.0, 4, 0.25)
    trace = Simulator(quiet("s", (node,), requests=400, clients=4), "oracle", 3).run()
    assert throughput(trace) == pytest.approx(node.throughput(4), rel=0.02)
    assert node.throughput(4) == pytest.approx(4 * 60.0 / 1.75)


def test_a_serial_node_delivers_its_speed_whatever_the_clients() -> None:
    trace = Simulator(quiet("s", (serial("s", 50.0),), requests=200, clients=8),
                      "oracle", 4).run()
    assert throughput(trace) == pytest.approx(50.0, rel=1e-6)


@pytest.mark.parametrize("clients", [4, 16])
def test_the_oracle_reaches_the_best_split(clients: int) -> None:
    nodes = (batching("fast", 90.0, 4, 0.25), batching("mid", 60.0, 8, 0.1),
             batching("slow", 30.0, 8, 0.05))
    split, best = best_split(nodes, clients)
    assert sum(split) == clients
    trace = Simulator(quiet("o", nodes, requests=2000, clients=clients), "oracle", 5).run()
    # Greedy on the true marginal gains holds the closed loop at the best split; request
    # lengths vary (64-512 tokens) so the mix drifts a little as requests end: within 3 %.
    assert throughput(trace) == pytest.approx(best, rel=0.03)


def test_the_best_split_of_a_roomy_fast_server_is_all_of_it() -> None:
    nodes = (batching("fast", 90.0, 16, 0.05), batching("mid", 60.0, 16, 0.05))
    assert best_split(nodes, 4)[0] == [4, 0]
    assert best_split((serial("a", 90.0), serial("b", 60.0)), 4)[0] in ([3, 1], [2, 2])


def test_bursty_arrivals_come_in_bursts_at_the_mean_rate() -> None:
    scenario = quiet("b", (whole("a", 1000.0, slots=64),), requests=8000, poisson_rate=2.0,
                     burst=8)
    requests = draw_requests(scenario, random.Random(6))
    gaps = [r.gap_s for r in requests]
    assert all(g == 0.0 for i, g in enumerate(gaps) if i % 8 != 7)
    # 1,000 burst gaps, exponential with mean 4 s: the mean gap has sd 0.5 / sqrt(1000)·8;
    # ±0.05 s per request is ~4 sd.
    assert statistics.fmean(gaps) == pytest.approx(0.5, abs=0.05)


def test_fail_events_set_and_clear_a_nodes_failure_rate() -> None:
    scenario = quiet("f", (whole("a", 60.0), whole("b", 50.0)), requests=300,
                     events=(Event(100, "fail", "a", factor=1.0),
                             Event(200, "fail", "a", factor=0.0)))
    sim = Simulator(scenario, "oracle", 7)
    trace = sim.run()
    assert not any(trace.failed)  # the oracle knows: it leaves a while a fails
    assert {sim.requests[i].nodes[0] for i in range(100, 200)} == {"b"}
    assert {sim.requests[i].nodes[0] for i in range(200, 300)} == {"a"}


def test_a_slow_event_slows_the_requests_already_running() -> None:
    scenario = quiet("s", (whole("a", 60.0, slots=4),), requests=8, clients=4,
                     events=(Event(4, "slow", "a", factor=2.0),))
    sim = Simulator(scenario, "oracle", 8)
    trace = sim.run()
    # The slowdown hits at the first completion (the arrival of request 4); the three
    # requests still running from t = 0 take twice as long for what they had left.
    slowed_at = min(trace.finish_s[:4])
    still = [i for i in range(4) if trace.finish_s[i] > slowed_at]
    assert len(still) == 3
    for i in still:
        solo = sim.requests[i].tokens / 60.0
        assert trace.finish_s[i] == pytest.approx(slowed_at + 2 * (solo - slowed_at))


def test_clients_bound_their_answers_and_the_router_sees_only_the_bound() -> None:
    scenario = Scenario("b", "b", (whole("a", 60.0),), 3000)
    requests = draw_requests(scenario, random.Random(3))
    bounds = [r.max_tokens for r in requests]
    # a third none, a third the fixed cap, a third a fitting power of two; never below the
    # answer (a server stops at max_tokens)
    assert 0.3 < bounds.count(None) / len(bounds) < 0.37
    assert 0.3 < bounds.count(FIXED_CAP) / len(bounds) < 0.37
    fitted = [(r.tokens, r.max_tokens) for r in requests
              if r.max_tokens not in (None, FIXED_CAP)]
    assert all(b is not None and b >= t > b // 2 and b & (b - 1) == 0 for t, b in fitted)
    sim = Simulator(quiet("s", (whole("a", 60.0),), requests=20), "thompson", 3)
    sim.run()
    bounded = [r for r in sim.requests if r.decision is not None]
    assert bounded and all(r.decision is not None and r.decision.max_tokens == r.max_tokens
                           for r in bounded)
