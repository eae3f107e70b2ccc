"""One base error for gossip and a subclass per reason a message or exchange is refused."""

from __future__ import annotations

from meshroute_middleware.core.errors import MeshRouteError


class GossipError(MeshRouteError):
    """Base of every gossip error; `reason` is the counter label it is counted under."""

    reason = "error"


class MalformedMessage(GossipError):
    """Not msgpack, or a field of the wrong type, range or shape."""

    reason = "malformed"


class OversizedMessage(GossipError):
    """Longer than the frame limit."""

    reason = "oversized"


class UnsupportedVersion(GossipError):
    """A wire version this tracker does not speak."""

    reason = "version"


class UnknownMessageType(GossipError):
    """A message type this tracker does not know, or one not expected here."""

    reason = "unknown_type"


class UnsignedMessage(GossipError):
    """No HMAC tag although a shared secret is set."""

    reason = "unsigned"


class ForgedMessage(GossipError):
    """An HMAC tag that does not verify."""

    reason = "forged"


class ExpiredMessage(GossipError):
    """A signed timestamp outside the replay window."""

    reason = "expired"


class ReplayedMessage(GossipError):
    """An exact copy of a message already accepted within the replay window."""

    reason = "replayed"


class SameOrigin(GossipError):
    """A peer gossips under our own tracker id (misconfiguration: its entries look like ours)."""

    reason = "same_origin"


class TransportError(GossipError):
    """A peer could not be reached or broke the exchange."""

    reason = "transport"


class PeerTimeout(TransportError):
    """A peer did not answer in time (or the message was lost)."""

    reason = "timeout"


class IdleConnection(TransportError):
    """An inbound connection that did not deliver its frame within the handshake timeout, or
    was dropped to make room while it had sent nothing whole."""

    reason = "idle"


class PeerUnreachable(TransportError):
    """Nothing listens at the peer's address, or the connection broke."""

    reason = "unreachable"
