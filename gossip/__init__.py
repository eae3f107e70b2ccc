"""Gossip between trackers: mergeable per-origin statistics, msgpack wire, transports, peers."""

from .errors import GossipError
from .memory import MemoryNetwork, MemoryTransport
from .peers import Membership, parse_address
from .service import GossipConfig, GossipCounters, GossipService
from .state import ApplyResult, Delta, Digest, apply_delta, make_delta, make_digest
from .transport import Address, TcpTransport, Transport
from .wire import MessageType, WireCodec

__all__ = [
    "Address",
    "ApplyResult",
    "Delta",
    "Digest",
    "GossipConfig",
    "GossipCounters",
    "GossipError",
    "GossipService",
    "Membership",
    "MemoryNetwork",
    "MemoryTransport",
    "MessageType",
    "TcpTransport",
    "Transport",
    "WireCodec",
    "apply_delta",
    "make_delta",
    "make_digest",
    "parse_address",
]
