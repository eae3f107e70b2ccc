"""The gateway's view of its mesh: node changes from every source go through here.

It is the TopologySink that discovery, POST /v1/nodes and --nodes-file feed: one validation
(`parse_node`), one place that bumps the router's topology and publishes node events, and the
one place that decides who may change a node (docs/security.md, "Who may change the mesh").

A write is either *trusted* (`claim=None`: a loopback or token-holding HTTP client, the nodes
file, an mDNS record signed with the mesh secret) or an *unsigned claim* named by its source,
`mdns:<service instance name>`. A claim may create an unknown node id and later refresh it
(queue, tps) while its URL stays the same; it may neither re-point nor remove an id that a
different source created, and its goodbye removes only ids the same announcement created. A
trusted write may change anything and makes the id trusted.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import ifaddr

from meshroute_middleware.core import InvalidNodeError, NodeRecord, Router, parse_node
from meshroute_middleware.telemetry.metrics import Telemetry

DEFAULT_MAX_NODES = 1024  # nodes per tracker (every model); docs/benchmarks.md "Bounds"
REFUSED = "refused"  # what `upsert` returns for a write this source may not make


class MeshFullError(InvalidNodeError):
    """A new node would take the tracker past its `max_nodes`."""


class LoopError(InvalidNodeError):
    """A node URL leads back to the gateway itself: every request would loop (issue 22)."""


_ANY = (ipaddress.ip_address("0.0.0.0"), ipaddress.ip_address("::"))
_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost"})


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        address = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


@dataclass(frozen=True, slots=True)
class Listening:
    """Where the gateway listens, to refuse node URLs that lead back to it: `port` on
    `addresses` (all of the machine's, and 0.0.0.0 / ::, when it listens on all) or any of
    `names` (loopback names, the machine's host names). A name that resolves here through
    DNS is not looked up (that would block the loop): the `via` check (chat/headers.py)
    catches what this misses."""

    port: int
    addresses: frozenset[ipaddress.IPv4Address | ipaddress.IPv6Address]
    names: frozenset[str]

    @classmethod
    def on(cls, host: str, port: int,
           machine: Iterable[str] | None = None) -> Listening | None:
        """The gateway listening on `host:port`; `machine`: the machine's addresses (read
        from its interfaces when None). None when the port is not known yet (0)."""
        if not port:
            return None
        bound = _address(host)
        names = set(_LOOPBACK_NAMES) if bound is None or bound.is_loopback \
            or bound in _ANY else set()
        if bound is None:  # a host name: itself and what the machine calls itself
            names.add(host.lower())
        addresses = {bound} if bound is not None else set()
        if bound is None or bound in _ANY:
            here = machine if machine is not None else _machine_addresses()
            addresses |= {a for a in map(_address, here) if a is not None}
            addresses |= set(_ANY)
            names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        return cls(port, frozenset(addresses), frozenset(names))

    def holds(self, url: str) -> bool:
        """Whether `url` (already a valid node URL) leads to this gateway."""
        parts = urlsplit(url)
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            return False
        if port != self.port:
            return False
        host = (parts.hostname or "").lower().rstrip(".")
        address = _address(host)
        if address is None:
            return host in self.names
        if address in self.addresses:
            return True
        # every 127.0.0.0/8 address reaches a socket bound to all addresses
        return address.is_loopback and bool(self.addresses & set(_ANY))


def _machine_addresses() -> list[str]:
    """Every address of this machine's interfaces (ifaddr, as zeroconf reads them)."""
    out = []
    for adapter in ifaddr.get_adapters():
        for ip in adapter.ips:
            out.append(ip.ip if isinstance(ip.ip, str) else ip.ip[0])
    return out


class Mesh:
    """Node bookkeeping over a Router; every method runs on the event loop."""

    def __init__(self, router: Router, telemetry: Telemetry,
                 max_nodes: int = DEFAULT_MAX_NODES, listening: Listening | None = None) -> None:
        self.router, self.telemetry, self.max_nodes = router, telemetry, max_nodes
        self.listening = listening  # the gateway's own address: a node there is a loop
        self._claims: dict[str, str] = {}  # node_id -> the unsigned source that created it

    def upsert(self, record: NodeRecord, claim: str | None = None) -> str:
        """Join or refresh a validated record; return the kind of change, or 'refused' when
        `claim` (an unsigned source) may not make it. MeshFullError past `max_nodes`."""
        if self.listening is not None and self.listening.holds(record.url):
            self.reject("mdns" if claim else "node", f"{record.node_id}: its URL leads back "
                        "to this gateway", "loop")
            raise LoopError(f"node {record.node_id!r}: {record.url} is this gateway itself "
                            "(a forwarding loop)")
        known = self.router.topology.node(record.node_id)
        if claim is not None and known is not None:
            refusal = self._refusal(known, record, claim)
            if refusal:
                self.reject("mdns-claim", f"{record.node_id}: {refusal}")
                return REFUSED
        if known is None and self.router.topology.size() >= self.max_nodes:
            self.reject("node-limit", f"{record.node_id}: tracker holds {self.max_nodes} nodes")
            raise MeshFullError(f"this tracker already holds {self.max_nodes} nodes "
                                f"(--max-nodes)")
        try:
            change = self.router.upsert_node(record)
        except InvalidNodeError as exc:  # the topology's own rules (--node-networks)
            self.reject("mdns" if claim else "node", f"{record.node_id}: {exc}")
            raise
        if claim is None:
            self._claims.pop(record.node_id, None)
        elif known is None:
            self._claims[record.node_id] = claim
        if known is not None and known.model != record.model:  # moved: the old may be empty
            self._forget_if_gone(known.model)
        if change != "refresh":
            self.telemetry.events.publish("node", {"change": change, "node": record.to_dict()})
        return change

    def _refusal(self, known: NodeRecord, record: NodeRecord, claim: str) -> str:
        owner = self._claims.get(record.node_id)
        if owner != claim:
            return (f"node id already announced by {owner or 'a trusted source'}; "
                    f"unsigned {claim[:80]} may not change it")
        if known.url != record.url:
            return "an unsigned record may not re-point a known node to another URL"
        return ""

    def upsert_raw(self, data: Mapping[str, Any], source: str) -> tuple[NodeRecord, str]:
        """Validate then upsert as a trusted write; InvalidNodeError (counted as rejected) if
        malformed, MeshFullError past `max_nodes`."""
        try:
            record = parse_node(data, now=self.router.clock(),
                                networks=self.router.topology.networks)
        except InvalidNodeError as exc:
            self.reject(source, str(exc))
            raise
        return record, self.upsert(record)

    def remove(self, node_id: str, claim: str | None = None) -> bool:
        """A node left (goodbye, DELETE, failed health checks). An unsigned goodbye (`claim`)
        removes only a node that the same source created."""
        if claim is not None and self._claims.get(node_id) != claim:
            if self.router.topology.node(node_id) is not None:
                self.reject("mdns-claim", f"{node_id}: goodbye from {claim[:80]}, which did "
                            "not announce it")
            return False
        known = self.router.topology.node(node_id)
        removed = self.router.remove_node(node_id)
        self._claims.pop(node_id, None)
        if known is not None:
            self._forget_if_gone(known.model)
        if removed:
            self.telemetry.events.publish("node", {"change": "leave", "node_id": node_id})
        return removed

    def _forget_if_gone(self, model: str) -> None:
        """A model with no node left is forgotten by the router: its metric series too."""
        if self.router.topology.model(model) is None:
            self.telemetry.forget_model(model)

    def nodes(self) -> list[NodeRecord]:
        """Every node currently in the topology."""
        return self.router.topology.nodes()

    def reject(self, source: str, reason: str, kind: str = "") -> None:
        """Count and publish a refused record (`kind`: a fixed word, the metric's reason)."""
        self.telemetry.reject(source, reason, kind)


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
