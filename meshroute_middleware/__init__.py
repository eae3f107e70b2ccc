"""meshroute: a learned router for LLM chat traffic."""

from .core import (
    Decision,
    NodeRecord,
    Outcome,
    Router,
    RouterConfig,
    parse_node,
)

__all__ = ["Decision", "NodeRecord", "Outcome", "Router", "RouterConfig", "parse_node"]
__version__ = "0.1.0"
