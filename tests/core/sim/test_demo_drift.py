"""Issue 14: after a 3x slowdown of the best route in the demo's mesh, its share falls below
its new fair share within 10 s (simulated clock: the demo's mesh, clients and half-life).

Fair share: the route's true solo speed after the slowdown over the sum of every route's of
the model (the share a speed-proportional split would give it: 34 / (34 + 44 + 30 + 22) =
0.26 here). The oracle's share after the slowdown is 0 (gpu-b's route is faster and has room).
"""

from __future__ import annotations

import pytest

from meshroute_middleware.app.demo.driver import HALF_LIFE_S
from meshroute_middleware.app.demo.mesh import DRIFTER, MESH, QWEN
from meshroute_middleware.core import RouterConfig
from meshroute_middleware.core.sim.engine import Simulator
from meshroute_middleware.core.sim.metrics import falls_below, route_share
from meshroute_middleware.core.sim.model import Event, NodeSpec, Scenario

SLOW_AT = 450  # requests: ~44 s of simulated time at 4 clients, as the demo's drift at 45 s
CLIENTS = 4  # the demo's 6 clients send 60 % of their requests to this model
TOKENS = 24  # the demo's --max-tokens


def demo_scenario() -> Scenario:
    """The demo's qwen mesh (cpu-b's leave and gpu-c's join left out: gpu-a's route stays
    the best until it slows), the drifter slowing 3x."""
    specs = tuple(NodeSpec(n.node_id, n.start, n.end, n.layers,
                           1.0 / (n.tps * (n.end - n.start + 1)), n.slots,
                           slot_slowdown=n.slot_slowdown)
                  for n in MESH if n.model == QWEN)
    return Scenario("demo-drift", "the demo's best route slows 3x", specs, 900,
                    clients=CLIENTS, tokens=(TOKENS, TOKENS), hop_token_s=0.0005,
                    events=(Event(SLOW_AT, "slow", DRIFTER, factor=3.0),))


def fair_share(sim: Simulator, route: tuple[str, ...]) -> float:
    """The route's solo speed over the sum of every route's, after the slowdown (each
    route's per-token time as the simulator ran its first request, long before the slowdown
    (a request running through it gets its remaining compute re-timed), the drifter's hop
    3x slower)."""
    per_token = {r.nodes: sum(c * (3.0 if n == DRIFTER else 1.0)
                              for n, c in zip(r.nodes, r.compute_s, strict=True)) + r.hop_s
                 for r in reversed(sim.requests[:SLOW_AT])}  # each route's first request
    speeds = {k: 1.0 / v for k, v in per_token.items()}
    return speeds[route] / sum(speeds.values())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_slowed_best_route_falls_below_its_fair_share_within_10_s(seed: int) -> None:
    sim = Simulator(demo_scenario(), "thompson", seed, RouterConfig(half_life_s=HALF_LIFE_S))
    sim.run()
    t0 = sim.requests[SLOW_AT].arrival_s
    route = next(r.nodes for r in sim.requests[:SLOW_AT] if DRIFTER in r.nodes)
    assert route == (DRIFTER, "cpu-c")
    assert len({r.nodes for r in sim.requests[:SLOW_AT]}) == 4  # every route was tried
    fair = fair_share(sim, route)
    assert fair == pytest.approx(0.26, abs=0.02)
    before = route_share(sim.requests, route, t0 - 10.0, t0)
    assert before is not None and before > 0.9  # it was the best route, and carried it all
    took = falls_below(sim.requests, route, t0, fair)  # trailing 2 s windows
    assert took is not None and took <= 10.0
    later = route_share(sim.requests, route, t0 + 10.0, t0 + 20.0)
    assert later is not None and later < fair  # and it stays below


def test_falls_below_reads_trailing_windows() -> None:
    sim = Simulator(demo_scenario(), "oracle", 1)
    sim.run()
    t0 = sim.requests[SLOW_AT].arrival_s
    route = (DRIFTER, "cpu-c")
    assert route_share(sim.requests, route, t0 - 10.0, t0) == 1.0
    # The oracle leaves at once: the first full window after the change is below any level.
    took = falls_below(sim.requests, route, t0, 0.01)
    assert took is not None and took < 1.0
    assert falls_below(sim.requests, ("nowhere",), t0, 0.0) is None
    assert route_share(sim.requests, route, 1e9, 2e9) is None
