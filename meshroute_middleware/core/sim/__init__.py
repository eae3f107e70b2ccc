"""Learning-quality simulator: a discrete-event mesh driving the real Router (issue 6)."""

from .engine import Simulator, run
from .model import Event, NodeSpec, Scenario
from .reliability import POLICIES, RELIABILITY_SCENARIOS, run_reliability
from .scenarios import SCENARIOS
from .workload import Trace

__all__ = ["POLICIES", "RELIABILITY_SCENARIOS", "SCENARIOS", "Event", "NodeSpec", "Scenario",
           "Simulator", "Trace", "run", "run_reliability"]
