"""Gossip membership, pure: static and run-time peers, fanout, exponential backoff for the dead."""

from __future__ import annotations

import math
import random
from collections.abc import Collection
from dataclasses import dataclass

from .transport import Address

BACKOFF_BASE_S = 1.0  # first retry delay after a failed exchange (one gossip interval)
BACKOFF_MAX_S = 60.0  # a dead peer is still tried once a minute, so it rejoins on its own
MAX_PEERS = 1024  # membership is bounded even if discovery misbehaves


def parse_address(text: str) -> Address:
    """'HOST:PORT' or '[V6]:PORT' -> (host, port); ValueError when malformed."""
    host, sep, port_text = text.strip().rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"a gossip peer must be HOST:PORT, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    port = int(port_text)
    if not 0 < port < 65536 or not host:
        raise ValueError(f"a gossip peer must be HOST:PORT with a port in 1..65535, got {text!r}")
    return host, port


@dataclass(slots=True)
class PeerState:
    """One peer's standing: consecutive failures and when it may be tried again."""

    static: bool
    failures: int = 0
    retry_at: float = -math.inf


class Membership:
    """The peers this tracker gossips with. Callers pass `now` and the rng."""

    def __init__(self, static: tuple[Address, ...] = (), *, own: Address | None = None,
                 backoff_base_s: float = BACKOFF_BASE_S,
                 backoff_max_s: float = BACKOFF_MAX_S) -> None:
        self.own = own
        self.backoff_base_s = backoff_base_s
        self.backoff_max_s = backoff_max_s
        self._peers: dict[Address, PeerState] = {}
        for address in static:
            self._add(address, static=True)

    def _add(self, address: Address, static: bool) -> bool:
        if address == self.own or address in self._peers or len(self._peers) >= MAX_PEERS:
            return False
        self._peers[address] = PeerState(static)
        return True

    def add_peer(self, host: str, port: int) -> bool:
        """Add a peer found at run time (mDNS); return whether it was new."""
        return self._add((host, int(port)), static=False)

    def remove_peer(self, host: str, port: int) -> bool:
        """Forget a peer (it left); return whether it was known."""
        return self._peers.pop((host, int(port)), None) is not None

    def peers(self) -> list[Address]:
        """Every known peer, sorted."""
        return sorted(self._peers)

    def state(self, address: Address) -> PeerState | None:
        """A peer's standing, or None."""
        return self._peers.get(address)

    def pick(self, fanout: int, now: float, rng: random.Random,
             exclude: Collection[Address] = ()) -> list[Address]:
        """Up to `fanout` distinct peers not backing off nor excluded, chosen uniformly."""
        ready = [a for a in sorted(self._peers)
                 if self._peers[a].retry_at <= now and a not in exclude]
        return rng.sample(ready, min(max(fanout, 0), len(ready)))

    def mark_ok(self, address: Address) -> None:
        """An exchange succeeded: the peer is healthy again."""
        peer = self._peers.get(address)
        if peer is not None:
            peer.failures, peer.retry_at = 0, -math.inf

    def mark_failed(self, address: Address, now: float) -> float:
        """An exchange failed: back off base·2^(k-1) up to the maximum; return the delay."""
        peer = self._peers.get(address)
        if peer is None:
            return 0.0
        peer.failures += 1
        delay = min(self.backoff_base_s * 2.0 ** min(peer.failures - 1, 30), self.backoff_max_s)
        peer.retry_at = now + delay
        return delay
