"""Replay protection that survives a restart, pure and bounded.

A pushed DELTA is accepted only as the answer to a DELTA this process sent (its `reply_to`
names a nonce held by `Challenges`, each usable once, expiring after `REPLAY_WINDOW_S`), and a
reply only when it names the request it answers. A process that restarts holds no challenge,
so a frame recorded before the restart answers nothing; no state is persisted. Signed frames
are also checked against the clock and for exact copies within the window (`ReplayGuard`).
"""

from __future__ import annotations

import secrets
from collections import OrderedDict

from meshroute_middleware.core.defaults import MAX_SKEW_S

from . import errors as err

REPLAY_WINDOW_S = MAX_SKEW_S  # signed timestamps further from our clock are refused
MAX_REPLAY_TAGS = 65_536  # tags remembered for duplicate detection (oldest evicted first)


def new_nonce() -> int:
    """64 unpredictable, non-zero bits (0 means "answers nothing")."""
    return secrets.randbelow(2**64 - 1) + 1


class ReplayGuard:
    """Remembers tags accepted within the window; pure, bounded."""

    def __init__(self, window_s: float = REPLAY_WINDOW_S, max_tags: int = MAX_REPLAY_TAGS):
        self.window_s = window_s
        self.max_tags = max_tags
        self._expiry: OrderedDict[bytes, float] = OrderedDict()

    def check(self, tag: bytes, sent_at: float, now: float) -> None:
        """Raise ExpiredMessage / ReplayedMessage, else remember the tag."""
        if abs(now - sent_at) > self.window_s:
            raise err.ExpiredMessage(f"timestamp {now - sent_at:+.1f} s off our clock")
        while self._expiry and next(iter(self._expiry.values())) < now:
            self._expiry.popitem(last=False)
        if tag in self._expiry:
            raise err.ReplayedMessage("an exact copy was already accepted")
        if len(self._expiry) >= self.max_tags:
            self._expiry.popitem(last=False)
        self._expiry[tag] = sent_at + self.window_s


class Challenges:
    """Nonces of the replies this process sent that ask for a push; each answers once. Pure,
    bounded (oldest evicted first), forgotten at restart: that is what refuses old pushes."""

    def __init__(self, ttl_s: float = REPLAY_WINDOW_S, max_open: int = MAX_REPLAY_TAGS):
        self.ttl_s = ttl_s
        self.max_open = max_open
        self._open: OrderedDict[int, tuple[str, float]] = OrderedDict()

    def issue(self, nonce: int, peer: str, now: float) -> None:
        """Remember that our frame `nonce` to tracker `peer` may be answered until now + ttl."""
        while self._open and (len(self._open) >= self.max_open
                              or next(iter(self._open.values()))[1] < now):
            self._open.popitem(last=False)
        self._open[nonce] = (peer, now + self.ttl_s)

    def redeem(self, reply_to: int, peer: str, now: float) -> None:
        """Consume the challenge a push answers; ReplayedMessage if there is none."""
        held = self._open.pop(reply_to, None)
        if held is None or held[0] != peer or held[1] < now:
            raise err.ReplayedMessage("a push that answers no open exchange of ours "
                                      "(a replay, or sent before our restart)")
