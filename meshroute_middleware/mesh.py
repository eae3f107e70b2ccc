"""The gateway's view of its mesh: node changes from every source go through here.

It is the TopologySink that discovery, POST /v1/nodes and --nodes-file feed: one validation
(`parse_node`), one place that bumps the router's topology and publishes node events.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .core import InvalidNodeError, NodeRecord, Router, parse_node
from .telemetry import Telemetry


class Mesh:
    """Node bookkeeping over a Router; every method runs on the event loop."""

    def __init__(self, router: Router, telemetry: Telemetry) -> None:
        self.router, self.telemetry = router, telemetry

    def upsert(self, record: NodeRecord) -> str:
        """Join or refresh a validated record; return the kind of change."""
        change = self.router.upsert_node(record)
        if change != "refresh":
            self.telemetry.events.publish("node", {"change": change, "node": record.to_dict()})
        return change

    def upsert_raw(self, data: Mapping[str, Any], source: str) -> tuple[NodeRecord, str]:
        """Validate then upsert; InvalidNodeError (counted as rejected) if malformed."""
        try:
            record = parse_node(data, now=self.router.clock(),
                                networks=self.router.topology.networks)
        except InvalidNodeError as exc:
            self.reject(source, str(exc))
            raise
        return record, self.upsert(record)

    def remove(self, node_id: str) -> bool:
        """A node left (goodbye, DELETE, failed health checks)."""
        removed = self.router.remove_node(node_id)
        if removed:
            self.telemetry.events.publish("node", {"change": "leave", "node_id": node_id})
        return removed

    def nodes(self) -> list[NodeRecord]:
        """Every node currently in the topology."""
        return self.router.topology.nodes()

    def reject(self, source: str, reason: str) -> None:
        """Count and publish a refused record."""
        self.telemetry.reject(source, reason)


def load_nodes_file(path: str) -> list[dict[str, Any]]:
    """A static mesh: a JSON list of node records, or {"nodes": [...]}; ValueError if not."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"cannot read nodes file {path}: {exc}") from exc
    if isinstance(data, dict):
        data = data.get("nodes")
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of node records or {{\"nodes\": [...]}}")
    return data
