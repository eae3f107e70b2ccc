"""Learning-quality simulator: a discrete-event mesh driving the real Router (issue 6)."""

from meshroute_middleware.core.sim.engine import Simulator, Trace, run
from meshroute_middleware.core.sim.model import Event, NodeSpec, Scenario
from meshroute_middleware.core.sim.scenarios import SCENARIOS

__all__ = ["SCENARIOS", "Event", "NodeSpec", "Scenario", "Simulator", "Trace", "run"]
