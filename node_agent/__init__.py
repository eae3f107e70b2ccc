"""What runs beside an inference node: mDNS announcement, tracker discovery, an emulated shard."""

from .announcer import NodeAnnouncer, TrackerAnnouncer
from .discovery import Discovery, TopologySink, health_checks, tracker_discovery
from .emulator import EmulatedNode, serve_node
from .mdns import NODE_SERVICE, TRACKER_SERVICE, decode_record, encode_record
from .shard import EmulatorConfig

__all__ = [
    "NODE_SERVICE", "TRACKER_SERVICE", "Discovery", "EmulatedNode", "EmulatorConfig",
    "NodeAnnouncer", "TopologySink", "TrackerAnnouncer", "decode_record", "encode_record",
    "health_checks", "serve_node", "tracker_discovery",
]
