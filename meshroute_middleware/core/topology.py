"""Node records and the per-model topology: joins, leaves and shard changes bump an epoch."""

from __future__ import annotations

import ipaddress
import math
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .cache_prior import CachePrior, parse_cache_prior, prior_fields
from .capabilities import CAPABILITIES, DEFAULT_CAPS, parse_caps
from .contracts.limits import MAX_ID_CHARS, MAX_TPS
from .errors import InvalidNodeError
from .kinds import JOIN, REFRESH, SHARD_CHANGE, ChangeKind
from .node_load import held_fields, parse_held_field
from .slot_count import parse_slot_count, slot_fields

MAX_LAYERS = 100_000
MAX_QUEUE = 1_000_000
# \Z, not $: `$` also matches before a final newline ("gpu-a\n" would pass)
_ID_RE = re.compile(r"^[A-Za-z0-9._:@/+-]+\Z")
# Printable ASCII only (no whitespace, ESC, backspace, NUL, DEL: they reached log lines);
# no userinfo, query or fragment.
_URL_RE = re.compile(r"^https?://(?:(?![/?#@])[!-~])+(/(?:(?![?#])[!-~])*)?\Z")
_HOST_PORT_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:[0-9]{1,5})?$")
_NUMERIC_HOST_RE = re.compile(r"^(0x[0-9a-f]+|[0-9]+)(\.(0x[0-9a-f]+|[0-9]+))*$", re.I)
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# Never a node: link-local (cloud metadata lives at 169.254.169.254) and AWS's IPv6 metadata.
_REFUSED_NETWORKS: tuple[Network, ...] = (
    ipaddress.ip_network("169.254.0.0/16"), ipaddress.ip_network("fe80::/10"),
    ipaddress.ip_network("fd00:ec2::254/128"),
)
_REFUSED_NAMES = frozenset({"metadata.google.internal", "metadata", "instance-data"})
_INT_RE = re.compile(r"^-?[0-9]{1,18}$")  # ASCII digits only: int() also takes '١' and '_'



@dataclass(frozen=True, slots=True)
class NodeRecord:
    """One inference node serving layers start..end (inclusive) of a model with `layers` layers."""

    node_id: str
    model: str
    start: int
    end: int
    layers: int
    url: str
    tps: float = 10.0
    queue: int = 0
    rep: float = 1.0
    seen_at: float = 0.0
    caps: frozenset[str] = DEFAULT_CAPS  # what it serves beyond plain chat (capabilities.py)
    # The server's own prefix-cache report, where it exports one (core/cache_prior.py).
    cache: CachePrior | None = None
    # How many requests its server runs at once, where it says (core/slot_count.py).
    slots: int | None = None
    # How many it runs and queues now, every sender's, where it says (core/node_load.py).
    held: int | None = None
    # Whether its server continues a trailing assistant message (mid-stream failover, issue
    # 34); a node says so only when it cannot (`continues: false`).
    continues: bool = True

    @property
    def effective_tps(self) -> float:
        """Queue-adjusted throughput times reputation (ADR-0021's prior for one hop)."""
        return self.tps / (1 + self.queue) * self.rep

    def to_dict(self) -> dict[str, Any]:
        """The record as JSON-ready fields, the shape POST /v1/nodes accepts."""
        return {
            "node_id": self.node_id, "model": self.model, "start": self.start,
            "end": self.end, "layers": self.layers, "url": self.url, "tps": self.tps,
            "queue": self.queue, "rep": self.rep, "seen_at": self.seen_at,
            "caps": [c for c in CAPABILITIES if c in self.caps],
            **prior_fields(self.cache), **slot_fields(self.slots), **held_fields(self.held),
            **({} if self.continues else {"continues": False}),
        }


def _as_int(data: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = data.get(key, default)
    if value is None:
        raise InvalidNodeError(f"'{key}' is required")
    if isinstance(value, bool):
        raise InvalidNodeError(f"'{key}' must be an integer, not a boolean")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, str) and _INT_RE.match(value.strip()):
        value = int(value.strip())
    if not isinstance(value, int):
        raise InvalidNodeError(f"'{key}' must be an integer, got {value!r}")
    return value


def _as_float(data: Mapping[str, Any], key: str, default: float) -> float:
    value = data.get(key, default)
    if isinstance(value, bool):
        raise InvalidNodeError(f"'{key}' must be a number, not a boolean")
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise InvalidNodeError(f"'{key}' must be a number, got {value!r}") from None
    if not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidNodeError(f"'{key}' must be a finite number, got {value!r}")
    return float(value)


def _as_text(data: Mapping[str, Any], key: str) -> str:
    value = data.get(key)
    if not isinstance(value, str) or not value:
        raise InvalidNodeError(f"'{key}' must be a non-empty string")
    if len(value) > MAX_ID_CHARS:
        raise InvalidNodeError(f"'{key}' is longer than {MAX_ID_CHARS} characters")
    if not value.isprintable():
        raise InvalidNodeError(f"'{key}' holds control characters")
    return value


def parse_networks(values: Iterable[str]) -> tuple[Network, ...]:
    """`--node-networks` CIDRs as networks; ValueError naming a malformed one."""
    out = []
    for value in values:
        try:
            out.append(ipaddress.ip_network(value.strip(), strict=False))
        except ValueError:
            raise ValueError(f"not a network in CIDR notation: {value!r}") from None
    return tuple(out)


def check_node_url(url: str, networks: Iterable[Network] = ()) -> None:
    """Where a node may point (docs/security.md): http(s) without userinfo, query or
    fragment; never a link-local or cloud-metadata address; inside `networks` when any are
    given (then the host must be an IP literal: a name could resolve anywhere)."""
    if not _URL_RE.match(url) or len(url) > 2048:
        raise InvalidNodeError(f"'url' must be an http(s) URL without user info, query or "
                               f"fragment, got {url!r}")
    hostport = url.split("://", 1)[1].split("/", 1)[0]
    match = _HOST_PORT_RE.match(hostport)
    if match is None:
        raise InvalidNodeError(f"'url' has a malformed host: {url!r}")
    host = match.group(1).strip("[]").lower()
    port = match.group(2)
    if port is not None and not 0 < int(port[1:]) <= 65535:
        raise InvalidNodeError(f"'url' has a port out of range: {url!r}")
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address | None = (
            ipaddress.ip_address(host))
    except ValueError:
        address = None
        if _NUMERIC_HOST_RE.match(host):  # 2852039166, 0xa9fea9fe, 169.254.43518: refused
            raise InvalidNodeError(f"'url' host must be a dotted IPv4 address or a name, "
                                   f"got {host!r}") from None
        if host.rstrip(".") in _REFUSED_NAMES:
            raise InvalidNodeError(f"'url' points at a cloud metadata service: {url!r}") from None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    if address is not None and any(address in net for net in _REFUSED_NETWORKS):
        raise InvalidNodeError(f"'url' points at a link-local or metadata address: {url!r}")
    networks = tuple(networks)
    if networks and (address is None or not any(address in net for net in networks)):
        raise InvalidNodeError(f"'url' host {host!r} is outside the allowed node networks")


def parse_node(data: Mapping[str, Any], *, now: float = 0.0,
               networks: Iterable[Network] = ()) -> NodeRecord:
    """Validate a node record from any source (mDNS, HTTP, file); raise InvalidNodeError.
    `networks`: where node URLs may point (`--node-networks`; empty: anywhere allowed)."""
    if not isinstance(data, Mapping):
        raise InvalidNodeError("a node record must be a JSON object")
    node_id, model = _as_text(data, "node_id"), _as_text(data, "model")
    if not _ID_RE.match(node_id):
        raise InvalidNodeError("'node_id' may hold only letters, digits and . _ : @ / + -")
    url = data.get("url")
    if not isinstance(url, str):
        raise InvalidNodeError(f"'url' must be an http(s) URL, got {url!r}")
    check_node_url(url, networks)
    layers = _as_int(data, "layers")
    start, end = _as_int(data, "start"), _as_int(data, "end")
    if not 0 < layers <= MAX_LAYERS:
        raise InvalidNodeError(f"'layers' must be in 1..{MAX_LAYERS}, got {layers}")
    if start < 0 or end < 0:
        raise InvalidNodeError(f"layers cannot be negative (start={start}, end={end})")
    if start > end:
        raise InvalidNodeError(f"'start' ({start}) is after 'end' ({end})")
    if end >= layers:
        raise InvalidNodeError(f"'end' ({end}) must be below 'layers' ({layers})")
    tps = _as_float(data, "tps", 10.0)
    if not 0 < tps <= MAX_TPS:
        raise InvalidNodeError(f"'tps' must be in (0, {MAX_TPS:g}], got {tps:g}")
    queue = _as_int(data, "queue", 0)
    if not 0 <= queue <= MAX_QUEUE:
        raise InvalidNodeError(f"'queue' must be in 0..{MAX_QUEUE}, got {queue}")
    rep = _as_float(data, "rep", 1.0)
    if not 0 <= rep <= 1:
        raise InvalidNodeError(f"'rep' must be in [0, 1], got {rep:g}")
    return NodeRecord(node_id, model, start, end, layers, url.rstrip("/"), tps, queue, rep, now,
                      _caps(data), cache=parse_cache_prior(data),
                      slots=parse_slot_count(data), held=parse_held_field(data),
                      continues=_continues(data))


def _continues(data: Mapping[str, Any]) -> bool:
    """A record's `continues` (a JSON boolean, or the TXT record's text); True when absent."""
    value = data.get("continues", True)
    if value in (True, False):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
        return value.strip().lower() in ("true", "1")
    raise InvalidNodeError(f"'continues' must be true or false, got {str(value)[:16]!r}")


def _caps(data: Mapping[str, Any]) -> frozenset[str]:
    """The node's declared capabilities (a list, or the TXT record's comma-separated text);
    DEFAULT_CAPS when it declares none."""
    if "caps" not in data or data["caps"] is None:
        return DEFAULT_CAPS
    try:
        return parse_caps(data["caps"], "'caps'")
    except ValueError as exc:
        raise InvalidNodeError(str(exc)) from None


@dataclass(slots=True)
class ModelTopology:
    """The nodes of one model, with a version that changes on any change and an epoch."""

    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    epoch: int = 0  # bumped by join / leave / shard change (ADR-0021)
    changed_at: float = float("-inf")  # wall-clock time of the last epoch bump
    version: int = 0  # bumped by any change, including queue/tps refreshes


MAX_DEPARTED = 1024  # model names remembered after their last node left (as --max-nodes)


class Topology:
    """Node records per model. Pure: callers pass `now`; nothing here does I/O.

    `networks` (`--node-networks`) is checked again on every upsert, whatever the record's
    source, so a record built without it (mDNS, a static file) cannot slip past."""

    def __init__(self, networks: Iterable[Network] = ()) -> None:
        self._models: dict[str, ModelTopology] = {}
        self._model_of: dict[str, str] = {}
        self.networks = tuple(networks)
        # models whose last node left, and when: a request for one is told the model is
        # gone for now (503), not unknown (404); bounded, oldest forgotten first
        self._departed: OrderedDict[str, float] = OrderedDict()

    def departed(self, model: str) -> float | None:
        """When the last node of `model` left, if it had nodes and has none now."""
        return self._departed.get(model)

    def models(self) -> list[str]:
        """Every model with at least one node, sorted."""
        return sorted(m for m, t in self._models.items() if t.nodes)

    def model(self, name: str) -> ModelTopology | None:
        """The topology of one model, or None."""
        return self._models.get(name)

    def nodes(self) -> list[NodeRecord]:
        """Every node of every model."""
        return [n for t in self._models.values() for n in t.nodes.values()]

    def node(self, node_id: str) -> NodeRecord | None:
        """One node's record, or None."""
        model = self._model_of.get(node_id)
        return None if model is None else self._models[model].nodes.get(node_id)

    def size(self) -> int:
        """How many nodes, over every model (what --max-nodes bounds)."""
        return len(self._model_of)

    def upsert(self, record: NodeRecord, now: float) -> ChangeKind:
        """Join or refresh a node; return 'join', 'shard-change' or 'refresh'.
        InvalidNodeError if its URL may not be a node's (nothing changes then)."""
        check_node_url(record.url, self.networks)
        old_model = self._model_of.get(record.node_id)
        if old_model is not None and old_model != record.model:
            self.remove(record.node_id, now)
            old_model = None
        topo = self._models.setdefault(record.model, ModelTopology())
        self._departed.pop(record.model, None)
        old = topo.nodes.get(record.node_id)
        record = replace(record, seen_at=now)
        topo.nodes[record.node_id] = record
        self._model_of[record.node_id] = record.model
        if old is not None and replace(old, seen_at=now) == record:
            return REFRESH  # a heartbeat: nothing a route depends on changed
        topo.version += 1
        if old is None:
            self._bump(topo, now)
            return JOIN
        if (old.start, old.end, old.layers, old.url) != (
            record.start, record.end, record.layers, record.url,
        ):
            self._bump(topo, now)
            return SHARD_CHANGE
        return REFRESH

    def remove(self, node_id: str, now: float) -> bool:
        """Remove a node (leave); return whether it was there."""
        model = self._model_of.pop(node_id, None)
        if model is None:
            return False
        topo = self._models[model]
        del topo.nodes[node_id]
        topo.version += 1
        self._bump(topo, now)
        self._drop_if_empty(model, topo, now)
        return True

    def _drop_if_empty(self, model: str, topo: ModelTopology, now: float) -> None:
        """A model without nodes is forgotten (bounded: models never outnumber nodes), all but
        its name among the departed (MAX_DEPARTED). A node joining it again bumps its change
        time to that moment, so nothing is lost."""
        if not topo.nodes:
            del self._models[model]
            self._departed[model] = now
            self._departed.move_to_end(model)
            while len(self._departed) > MAX_DEPARTED:
                self._departed.popitem(last=False)

    def note_change(self, model: str, changed_at: float) -> None:
        """Adopt a topology change time learned elsewhere (gossip) if it is newer. A model
        with no node here is not created: a join would stamp its own, later, change time."""
        topo = self._models.get(model)
        if topo is None:
            return
        if changed_at > topo.changed_at:
            topo.changed_at = changed_at
            topo.epoch += 1
            topo.version += 1

    @staticmethod
    def _bump(topo: ModelTopology, now: float) -> None:
        topo.epoch += 1
        topo.changed_at = max(topo.changed_at, now)
