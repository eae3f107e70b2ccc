"""Learning-quality simulator: a discrete-event mesh driving the real Router (issue 6)."""

from .engine import Simulator, run
from .model import Event, NodeSpec, Scenario
from .scenarios import SCENARIOS
from .workload import Trace

__all__ = ["SCENARIOS", "Event", "NodeSpec", "Scenario", "Simulator", "Trace", "run"]
