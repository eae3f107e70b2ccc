"""The ProviderRouter's side of gossip (core/providers/peers.py): what this tracker reports of
its provider routes and keys, and its peers' reports taken in."""

from __future__ import annotations

from collections.abc import Mapping

from .affinity import Affinity, Held, Turn, key_order
from .config import ProvidersConfig
from .keys import KeyGates
from .peers import Merged, Peers, PeerState
from .scoring import RouteStats


class Gossiped:
    """Mixed into ProviderRouter: its reports to gossip peers and theirs merged."""

    cfg: ProvidersConfig
    gates: KeyGates
    stats: dict[str, RouteStats]
    peers: Peers | None
    affinity: Affinity

    def warm(self, turn: Turn | None, now: float) -> tuple[Held | None, str | None]:
        """Where the conversation was served last while warm, here or (moved off its first
        key) at a peer, whichever is newer; else why not (affinity.Affinity.recall)."""
        told = (self.peers.moved(turn.conversation)
                if self.peers is not None and turn is not None else None)
        return self.affinity.recall(turn, now, None if told is None else Held(*told))

    def moved(self, turn: Turn, route: str, key: int, keys: int) -> bool:
        """Whether serving the turn on `key` is news to the peers: not its order's first
        key, or a peer had told of it (its later turns are then told too)."""
        return key_order(turn.conversation, route, keys)[0] != key or (
            self.peers is not None and self.peers.moved(turn.conversation) is not None)

    def report(self, now: float) -> PeerState:
        """What this tracker tells its gossip peers of its provider routes and keys (its key
        gates only when they take peers' reports in: a shared store counts them already)."""
        state = self.gates.report(now) if self.gates.peers is not None else PeerState(now)
        stats = {name: s for name, s in self.stats.items() if self.cfg.split_route(name)}
        moved = {c: (h.route, h.key, h.at, h.tokens, h.ttl_s)
                 for c, h in self.affinity.moves(now).items()}
        return PeerState(state.t, stats, state.cooldowns, state.revoked, state.clears,
                         state.usage, moved)

    def merge_peer(self, origin: str, state: PeerState, now: float) -> bool:
        """A gossip peer's own report (the newest per origin is kept); whether it was taken."""
        return self.peers is not None and self.peers.merge(origin, state, now)

    def relayed(self, now: float) -> dict[str, PeerState]:
        """The newest report of every other origin this tracker holds, to pass on."""
        if self.peers is None:
            return {}
        self.peers.prune(now)
        return dict(self.peers.states)

    def merge_reports(self, sender: str, reports: Mapping[str, PeerState], now: float, *,
                      own: str, relay: bool) -> Merged:
        """A peer's reports, last writer wins per origin (core/providers/peers.py)."""
        if self.peers is None:
            return Merged(ignored=len(reports))
        return self.peers.merge_all(reports, now, sender=sender, own=own, relay=relay)
