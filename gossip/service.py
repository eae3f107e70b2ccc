"""GossipService: push-pull anti-entropy rounds between trackers, around a Router.

Each round picks `fanout` peers; with each: send our DIGEST, receive a DELTA of what we lack plus
the peer's digest, apply it, push back a DELTA of what the peer lacks, receive an ACK. Every
refused message is counted by reason and logged; it never touches the state. Refused entries
(one bad entry, another origin's entry without authentication, a timestamp past the skew, a full
store) are counted by reason in `GossipCounters.entries_refused`; the rest of the frame applies.
Logs of refusals are rate-limited per reason (`LOG_EVERY_S`), so a flood cannot flood the log.

Trust (docs/security.md, "Gossip"): without a shared secret anyone who reaches the port can speak
for the origin it names, so `GossipConfig.checked` refuses a non-loopback listen address
without a secret unless `insecure` is set (then the service warns at start). With a secret,
frames are authenticated and entries of other origins are relayed; without one a tracker takes
only the sender's own entries and relays nothing. A reply must name the request it answers and a
pushed DELTA the reply that asked for it (`replay.Challenges`), so no recorded frame replays, even
after a restart.

Provider routes (issue 23): with `providers` set, each exchange ends with a PROVIDER_REPORTS
request carrying our report and the newest of every origin we hold, answered with the peer's;
each side keeps the newest per origin (a replayed or reordered report changes nothing, a report
for our own origin is refused), so reports reach every tracker over any connected peer graph.
Relayed reports are taken only with a secret, as mesh entries are. A peer that hangs up on the
type (one that speaks only PROVIDERS, its own report) is sent PROVIDERS at once instead, and for
LEGACY_RETRY_S, then asked again.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Protocol

import anyio
import anyio.abc

from meshroute_middleware.core.errors import MeshRouteError
from meshroute_middleware.core.providers.peers import Merged, PeerState
from meshroute_middleware.core.router import Router

from . import errors as err
from . import state as st
from .peers import Membership
from .replay import Challenges, new_nonce
from .reports_wire import Reports, bounded_reports
from .stats_wire import INVALID_CURVE, INVALID_ENTRY, sendable
from .transport import Address, TcpTransport, Transport
from .wire import Ack, Message, MessageType, WireCodec

log = logging.getLogger(__name__)

EXCHANGE_TIMEOUT_S = 2.0  # one exchange; a dead peer costs at most this, in parallel
LEGACY_RETRY_S = 60.0  # a peer that hung up on PROVIDER_REPORTS is sent PROVIDERS this long
LOG_EVERY_S = 60.0  # at most one log line per refusal reason per this many seconds


class ProviderPeers(Protocol):
    """What gossip exchanges of provider routes (issue 23): `ProviderRouter` is one."""

    def report(self, now: float) -> PeerState: ...
    def merge_peer(self, origin: str, state: PeerState, now: float) -> bool: ...
    def relayed(self, now: float) -> dict[str, PeerState]: ...
    def merge_reports(self, sender: str, reports: Mapping[str, PeerState], now: float, *,
                      own: str, relay: bool) -> Merged: ...


class InsecureGossipError(MeshRouteError, ValueError):
    """A non-loopback gossip listener without a shared secret, and no explicit opt-in."""


def is_loopback(host: str) -> bool:
    """Whether `host` names only this machine (127.0.0.0/8, ::1, localhost)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


@dataclass(frozen=True, slots=True)
class GossipConfig:
    """Gossip knobs and their defaults (the composition layer builds one from its settings:
    ServeSettings.gossip_config)."""

    listen: Address | None = None
    peers: tuple[Address, ...] = ()
    interval_s: float = 1.0
    fanout: int = 3
    secret: bytes | None = None
    timeout_s: float = EXCHANGE_TIMEOUT_S
    insecure: bool = False  # unauthenticated gossip off loopback, explicitly allowed

    @property
    def exposed(self) -> bool:
        """Whether strangers can reach an unauthenticated listener (warned about at start)."""
        return (self.secret is None and self.listen is not None
                and not is_loopback(self.listen[0]))

    def checked(self) -> GossipConfig:
        """This config, unless it exposes an unauthenticated listener without the explicit
        opt-in: InsecureGossipError then, since anyone on the network could steer routing."""
        if self.exposed and not self.insecure:
            assert self.listen is not None
            raise InsecureGossipError(
                f"--gossip-listen {self.listen[0]}:{self.listen[1]} is reachable from other "
                f"machines and no gossip secret is set: anyone there could steer routing. Set "
                f"--gossip-secret-file (or MESHROUTE_GOSSIP_SECRET), listen on loopback, or pass "
                f"--insecure-gossip to accept the risk")
        return self


def load_secret(path: str | None, inline: str | None) -> bytes | None:
    """The shared secret from the file at `path` or else `inline`, stripped; None if unset."""
    if path:
        try:
            text = Path(path).read_text().strip()
        except OSError as exc:
            raise ValueError(f"cannot read gossip secret file {path}: {exc}") from exc
        if not text:
            raise ValueError(f"gossip secret file {path} is empty")
        return text.encode()
    return inline.strip().encode() if inline else None


@dataclass(slots=True)
class GossipCounters:
    """Monotonic counters, exported by the gateway to Prometheus."""

    rounds: int = 0
    exchanges: int = 0
    exchange_failures: int = 0
    messages_sent: int = 0
    messages_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0
    entries_applied: int = 0
    entries_ignored: int = 0
    rejected: dict[str, int] = field(default_factory=dict)
    entries_refused: dict[str, int] = field(default_factory=dict)

    def reject(self, reason: str) -> None:
        """Count one refused message or failed exchange by reason."""
        self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def refuse_entries(self, reason: str, n: int) -> None:
        """Count n refused entries (or change times) by reason."""
        if n:
            self.entries_refused[reason] = self.entries_refused.get(reason, 0) + n


class Throttle:
    """Lets one log line per key through every `every_s` seconds; counts what it held back."""

    def __init__(self, clock: Callable[[], float], every_s: float = LOG_EVERY_S) -> None:
        self.clock = clock
        self.every_s = every_s
        self._next: dict[str, float] = {}
        self.held: dict[str, int] = {}

    def __call__(self, key: str) -> int | None:
        """None to stay quiet, else how many lines were held back since the last one."""
        now = self.clock()
        if now < self._next.get(key, -math.inf):
            self.held[key] = self.held.get(key, 0) + 1
            return None
        if len(self._next) > 256:  # keys are reasons, a small fixed set; stay bounded anyway
            self._next.clear()
        self._next[key] = now + self.every_s
        return self.held.pop(key, 0)


class GossipService:
    """Runs a tracker's gossip: `async with GossipService(router, config) as svc: ...`."""

    def __init__(self, router: Router, config: GossipConfig, *,
                 transport: Transport | None = None, clock: Callable[[], float] | None = None,
                 rng: random.Random | None = None,
                 providers: ProviderPeers | None = None) -> None:
        self.router = router
        self.providers = providers  # provider reports, exchanged after each push-pull
        self.config = config
        self.clock = clock or router.clock
        self.rng = rng or random.Random()
        self.counters = GossipCounters()
        self.origin = router.stats.origin
        self.codec = WireCodec(self.origin, config.secret)
        self.challenges = Challenges()
        self._throttle = Throttle(self.clock)
        self.membership = Membership(config.peers, own=config.listen)
        host, port = config.listen or ("127.0.0.1", 0)
        self.transport: Transport = transport or TcpTransport(
            host, port, on_error=lambda e: self.counters.reject(e.reason))
        self.address: Address | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._busy: set[Address] = set()  # peers with an exchange in flight
        self._legacy: dict[Address, float] = {}  # peers that hung up on PROVIDER_REPORTS:
        # sent PROVIDERS until then (a dead peer is not marked old for good)

    # -- lifecycle ----------------------------------------------------------------------------
    async def __aenter__(self) -> GossipService:
        if self.config.exposed:
            log.warning("gossip: listening on %s WITHOUT a shared secret (--insecure-gossip): "
                        "anyone who reaches it can feed this tracker statistics",
                        self.config.listen)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        if self.config.listen is not None:
            self.address = await self._tg.start(self.transport.serve, self.handle)
            self.membership.own = self.address
        self._tg.start_soon(self._loop)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> bool | None:
        assert self._tg is not None
        self._tg.cancel_scope.cancel()
        return await self._tg.__aexit__(exc_type, exc, tb)

    async def run(self, *, task_status: anyio.abc.TaskStatus[Address | None]
                  = anyio.TASK_STATUS_IGNORED) -> None:
        """Run until cancelled, as a task: `await task_group.start(service.run)`."""
        async with self:
            task_status.started(self.address)
            await anyio.sleep_forever()

    async def _loop(self) -> None:
        """Start a round every interval without awaiting it: a peer that hangs until the
        timeout never delays the next round (and is skipped while its exchange is open)."""
        assert self._tg is not None
        while True:
            await anyio.sleep(self.config.interval_s)
            for peer in self.pick():
                self._tg.start_soon(self.exchange, peer)

    def add_peer(self, host: str, port: int) -> bool:
        """A peer found at run time (the tracker discovery callback); True if new."""
        return self.membership.add_peer(host, port)

    def remove_peer(self, host: str, port: int) -> bool:
        """A peer that left; True if it was known."""
        return self.membership.remove_peer(host, port)

    # -- initiating ---------------------------------------------------------------------------
    def pick(self) -> list[Address]:
        """The peers of one round (up to `fanout`, none with an exchange in flight)."""
        self.counters.rounds += 1
        self.router.prune()
        return self.membership.pick(self.config.fanout, self.clock(), self.rng,
                                    exclude=self._busy)

    async def exchange(self, peer: Address) -> bool:
        """Push-pull with one peer; return whether it completed. Never raises GossipError."""
        self.counters.exchanges += 1
        self._busy.add(peer)
        try:
            digest = st.make_digest(self.router.stats, self.router.topology)
            reply = await self._request(peer, digest, MessageType.DELTA)
            assert isinstance(reply.body, st.Delta)
            self._apply(reply.body, reply.sender)
            if reply.body.digest is not None:
                self._note(reply.body.digest, reply.sender)
                push = self._delta_for(reply.body.digest)
                if push.entries or push.changes:
                    await self._request(peer, push, MessageType.ACK, reply_to=reply.nonce)
            if self.providers is not None:  # our reports for theirs, every origin's newest
                await self._swap_reports(peer, reply.sender, self.providers)
        except err.SameOrigin as exc:
            self.counters.exchange_failures += 1
            self.counters.reject(exc.reason)
            self.membership.remove_peer(*peer)  # ourselves (mDNS echo) or a twin: stop asking
            self._log(logging.WARNING, exc.reason, "dropped peer %s: %s", peer, exc)
            return False
        except err.GossipError as exc:
            self.counters.exchange_failures += 1
            self.counters.reject(exc.reason)
            delay = self.membership.mark_failed(peer, self.clock())
            self._log(logging.INFO, exc.reason, "exchange with %s failed (%s: %s); retry in %.0f s",
                      peer, exc.reason, exc, delay)
            return False
        finally:
            self._busy.discard(peer)
        self.membership.mark_ok(peer)
        return True

    async def _swap_reports(self, peer: Address, origin: str, providers: ProviderPeers) -> None:
        """PROVIDER_REPORTS both ways; with a peer that hung up on it (one that predates it
        refuses the type: unknown_type, no reply), PROVIDERS at once and for LEGACY_RETRY_S."""
        if self._legacy.get(peer, -math.inf) <= self.clock():
            try:
                reply = await self._request(peer, self._reports(providers, origin),
                                            MessageType.PROVIDER_REPORTS)
            except err.PeerUnreachable as exc:
                self.counters.reject(exc.reason)
                self._log(logging.INFO, "provider_reports", "%s hung up on PROVIDER_REPORTS; "
                          "sending it PROVIDERS", peer)
                if len(self._legacy) > 1024:
                    self._legacy.clear()
                self._legacy[peer] = self.clock() + LEGACY_RETRY_S
            else:
                assert isinstance(reply.body, Reports)
                self._merge_reports(providers, reply.sender, reply.body)
                return
        answer = await self._request(peer, providers.report(self.clock()), MessageType.PROVIDERS)
        assert isinstance(answer.body, PeerState)
        providers.merge_peer(answer.sender, answer.body, self.clock())

    def _reports(self, providers: ProviderPeers, to: str) -> Reports:
        """Our report and, with a secret (others' are taken only then), everyone's we hold
        but the receiver's own (it refuses those)."""
        now = self.clock()
        relayed = providers.relayed(now) if self.codec.authenticated else {}
        relayed.pop(to, None)
        return bounded_reports(self.origin, providers.report(now), relayed)

    def _merge_reports(self, providers: ProviderPeers, sender: str, body: Reports) -> None:
        merged = providers.merge_reports(sender, body.by_origin, self.clock(), own=self.origin,
                                         relay=self.codec.authenticated)
        self.counters.entries_applied += merged.applied
        self.counters.entries_ignored += merged.ignored
        for reason, n in sorted(merged.refused.items()):
            self.counters.refuse_entries(reason, n)
            self._log(logging.WARNING, reason, "refused %d provider report(s) from %s (%s)",
                      n, sender, reason)

    def _log(self, level: int, reason: str, text: str, *args: object) -> None:
        """Log one line for `reason` unless one went out less than LOG_EVERY_S ago."""
        held = self._throttle(reason)
        if held is not None:
            suffix = f" ({held} more like it not logged)" if held else ""
            log.log(level, "gossip: " + text + suffix, *args)

    def _delta_for(self, digest: st.Digest, include_digest: bool = False) -> st.Delta:
        """What a peer lacks, only what it would accept (relayed entries only when signed)."""
        return st.make_delta(self.router.stats, self.router.topology, digest, sendable=sendable,
                             relay=self.codec.authenticated, include_digest=include_digest)

    async def _request(self, peer: Address, body: st.Digest | st.Delta | PeerState | Reports,
                       expect: MessageType, reply_to: int = 0) -> Message:
        nonce = new_nonce()
        data = self.codec.encode(body, self.clock(), nonce=nonce, reply_to=reply_to)
        self.counters.messages_sent += 1
        self.counters.bytes_sent += len(data)
        reply = await self.transport.request(peer, data, self.config.timeout_s)
        message = self._decode(reply)
        if message.kind is not expect:
            raise err.UnknownMessageType(f"expected {expect.name}, got {message.kind.name}")
        if message.reply_to != nonce:
            raise err.ReplayedMessage("a reply that does not answer our request")
        return message

    def _decode(self, data: bytes) -> Message:
        self.counters.messages_received += 1
        self.counters.bytes_received += len(data)
        message = self.codec.decode(data, self.clock())
        if message.sender == self.origin:
            raise err.SameOrigin(f"a peer gossips as our own origin {self.origin!r}")
        if message.refused:
            self.counters.refuse_entries(INVALID_ENTRY, message.refused)
            self._log(logging.WARNING, INVALID_ENTRY, "refused %d out-of-range item(s) from %s",
                      message.refused, message.sender)
        if message.refused_curves:
            self.counters.refuse_entries(INVALID_CURVE, message.refused_curves)
            self._log(logging.WARNING, INVALID_CURVE, "refused %d entr(y/ies) with a bad curve "
                      "summary from %s", message.refused_curves, message.sender)
        return message

    def _note(self, digest: st.Digest, sender: str) -> None:
        """The sender's own topology change stamps (clock skew: gossip/state.py)."""
        st.note_changes(self.router.stats, self.router.topology, digest.changes, digest.shapes,
                        self.clock(), sender=sender)

    def _apply(self, delta: st.Delta, sender: str) -> st.ApplyResult:
        result = st.apply_delta(self.router.stats, self.router.topology, delta, self.clock(),
                                sender=sender, relay=self.codec.authenticated)
        self.counters.entries_applied += result.applied
        self.counters.entries_ignored += result.ignored
        for reason, n in sorted(result.refused.items()):
            self.counters.refuse_entries(reason, n)
            self._log(logging.WARNING, reason, "refused %d entr(y/ies) from %s (%s)",
                      n, sender, reason)
        return result

    # -- answering ----------------------------------------------------------------------------
    async def handle(self, data: bytes, sender: Address) -> bytes | None:
        """Answer one inbound frame; refused frames are counted, logged and get no reply
        (except one from our own origin: an empty DELTA tells that initiator to drop us)."""
        reply: st.Delta | Ack | PeerState | Reports
        nonce, reply_to = new_nonce(), 0
        try:
            message = self._decode(data)
            reply_to = message.nonce
            reply = self._answer(message, nonce)
        except err.GossipError as exc:
            self.counters.reject(exc.reason)
            self._log(logging.WARNING, exc.reason, "refused a message from %s (%s: %s)",
                      sender, exc.reason, exc)
            if not isinstance(exc, err.SameOrigin):
                return None
            reply = st.Delta()
        out = self.codec.encode(reply, self.clock(), nonce=nonce, reply_to=reply_to)
        self.counters.messages_sent += 1
        self.counters.bytes_sent += len(out)
        return out

    def _answer(self, message: Message, nonce: int) -> st.Delta | Ack | PeerState | Reports:
        """The reply to a DIGEST (our delta and digest: a challenge the push must answer) or
        to a pushed DELTA (an ACK, once its challenge is redeemed)."""
        body = message.body
        if isinstance(body, st.Digest):
            self._note(body, message.sender)
            self.challenges.issue(nonce, message.sender, self.clock())
            return self._delta_for(body, include_digest=True)
        if isinstance(body, PeerState):  # a report is one origin's own, newest per origin
            if self.providers is None:
                return PeerState(self.clock())
            self.providers.merge_peer(message.sender, body, self.clock())
            return self.providers.report(self.clock())
        if isinstance(body, Reports):  # every origin's newest, for ours
            if self.providers is None:
                return Reports({self.origin: PeerState(self.clock())})
            self._merge_reports(self.providers, message.sender, body)
            return self._reports(self.providers, message.sender)
        if isinstance(body, st.Delta) and body.digest is None:
            self.challenges.redeem(message.reply_to, message.sender, self.clock())
            return Ack(self._apply(body, message.sender).applied)
        raise err.UnknownMessageType(f"{message.kind.name} is not a request")
