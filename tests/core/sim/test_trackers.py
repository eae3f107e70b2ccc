"""Several trackers in front of one mesh (issue 31): each sees its own clients, their
statistics gossip, the nodes' load reaches them on answers and pushes."""

from __future__ import annotations

import statistics
from dataclasses import replace

import pytest

from meshroute_middleware.core.sim.engine import Simulator
from meshroute_middleware.core.sim.metrics import throughput
from meshroute_middleware.core.sim.model import ANSWERS, EXACT, MODEL, NONE, Scenario
from meshroute_middleware.core.sim.oracle import FIXED_SPLIT, best_split
from meshroute_middleware.core.sim.scenarios import SLOTTED, by_name

SEEDS = (1, 2)  # tuning seeds: the simulator is deterministic per seed
SHORT = 600  # requests per run


def short(name: str, **kw: object) -> Scenario:
    return replace(by_name(name).scaled(SHORT), **kw)  # type: ignore[arg-type]


def of_split(scenario: Scenario, seed: int) -> float:
    """Thompson's delivered tokens/s over the best fixed split's, same requests."""
    split = throughput(Simulator(scenario, FIXED_SPLIT, seed).run())
    return throughput(Simulator(scenario, "thompson", seed).run()) / split


def test_the_best_fixed_split_keeps_two_on_the_fast_node() -> None:
    split, total = best_split(SLOTTED, 6)
    assert split == [2, 4]
    assert total == pytest.approx(2 * 2000.0 + 4 * 500.0)
    sim = Simulator(short("20", noise_sigma=0.0), FIXED_SPLIT, 1)
    assert throughput(sim.run()) == pytest.approx(total, rel=0.02)  # start and end aside


@pytest.mark.parametrize(("name", "owners"), [
    ("20", [0] * 6), ("21", [0, 0, 1, 1, 2, 2]), ("22", [0, 0, 0, 0, 1, 2]),
])
def test_each_client_is_served_by_its_own_tracker(name: str, owners: list[int]) -> None:
    sim = Simulator(short(name), "thompson", 1)
    sim.run()
    assert {r.client for r in sim.requests} == set(range(6))
    probe = sim.requests[0]
    assert [sim.routers.index(sim.router_of(replace(probe, client=c)))
            for c in range(6)] == owners


def test_statistics_gossip_between_the_trackers() -> None:
    sim = Simulator(short("21"), "thompson", 1)
    sim.run()
    origins = {"local", "tracker-1", "tracker-2"}
    for router in sim.routers:
        sig = router.candidates(MODEL)[0].signature
        assert set(router.stats.entries(MODEL, sig)) == origins


@pytest.mark.parametrize("name", ["21", "22"])
def test_the_nodes_reports_give_each_tracker_the_mesh_load(name: str) -> None:
    """Without the nodes' reports each tracker sees its own requests only and queues on the
    2-slot node; with them (every answer, the agent's refresh) it holds the best split."""
    with_reports = [of_split(short(name, load_view=ANSWERS), s) for s in SEEDS]
    blind = [of_split(short(name, load_view=NONE), s) for s in SEEDS]
    assert statistics.fmean(with_reports) >= 0.95
    assert statistics.fmean(blind) <= statistics.fmean(with_reports) - 0.05


def test_one_tracker_no_longer_queues_on_the_full_fast_node() -> None:
    assert statistics.fmean(of_split(short("20"), s) for s in SEEDS) >= 0.97


@pytest.mark.parametrize(("view", "error_below"), [(EXACT, 1e-9), (ANSWERS, 0.3)])
def test_the_staleness_of_a_trackers_view_is_measured(view: str, error_below: float) -> None:
    sim = Simulator(short("21", load_view=view), "thompson", 1)
    sim.run()
    total, count = sim.load_error
    assert count > 0
    assert total / count < error_below
    blind = Simulator(short("21", load_view=NONE), "thompson", 1)
    blind.run()
    assert blind.load_error[0] / blind.load_error[1] > 1.0  # own requests only: far off
