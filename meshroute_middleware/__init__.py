"""meshroute: a learned router for LLM chat traffic.

The names below are the core's, loaded on first use (PEP 562): importing the package itself
loads nothing else, so that the `meshroute` command (`__main__`) is ready for a Ctrl-C before
any heavy module loads.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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


def __getattr__(name: str) -> Any:
    """The core's exported names, imported when first asked for."""
    if name in __all__:
        return getattr(importlib.import_module(".core", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
