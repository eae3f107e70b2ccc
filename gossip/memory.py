"""An in-memory gossip network for tests and simulations: seeded drop, delay, duplication and
partitions, with the same request/response contract (and errors) as the TCP transport."""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

import anyio
import anyio.abc

from . import errors as err
from .transport import Address, Handler

log = logging.getLogger(__name__)


@dataclass(slots=True)
class NetworkCounters:
    """What crossed the network (requests and replies both count as messages)."""

    messages: int = 0
    bytes: int = 0
    dropped: int = 0
    duplicated: int = 0


class MemoryNetwork:
    """Connects MemoryTransports by address. Faults are drawn from one seeded generator.

    A lost message (dropped or across a partition) fails the request with PeerTimeout after
    `loss_wait_s` rather than the full timeout: a simulation then runs at the speed of the CPU;
    the failure the caller sees is the same.
    """

    def __init__(self, seed: int = 0, *, drop_rate: float = 0.0, duplicate_rate: float = 0.0,
                 delay_s: tuple[float, float] = (0.0, 0.0), loss_wait_s: float = 0.0) -> None:
        self.rng = random.Random(seed)
        self.drop_rate = drop_rate
        self.duplicate_rate = duplicate_rate
        self.delay_s = delay_s
        self.loss_wait_s = loss_wait_s
        self.counters = NetworkCounters()
        self._handlers: dict[Address, Handler] = {}
        self._group: dict[Address, int] = {}

    def transport(self, address: Address) -> MemoryTransport:
        """A transport bound to `address` on this network."""
        return MemoryTransport(self, address)

    def partition(self, *groups: list[Address]) -> None:
        """Split the network: only addresses in the same group reach each other."""
        self._group = {a: i for i, group in enumerate(groups) for a in group}

    def heal(self) -> None:
        """Undo any partition."""
        self._group = {}

    def _cut(self, a: Address, b: Address) -> bool:
        return self._group.get(a, -1) != self._group.get(b, -1)

    async def _lose(self, what: str) -> None:
        self.counters.dropped += 1
        await anyio.sleep(self.loss_wait_s)
        raise err.PeerTimeout(what)

    async def _carry(self, src: Address, dst: Address, payload: bytes) -> None:
        """One message in flight: count it, delay it, maybe lose it."""
        self.counters.messages += 1
        self.counters.bytes += len(payload)
        low, high = self.delay_s
        if high > 0:
            await anyio.sleep(self.rng.uniform(low, high))
        if self._cut(src, dst):
            await self._lose(f"{dst} is across a partition")
        if self.drop_rate and self.rng.random() < self.drop_rate:
            await self._lose(f"message {src} -> {dst} lost")

    async def deliver(self, src: Address, dst: Address, payload: bytes,
                      timeout_s: float) -> bytes:
        """Carry a request to `dst`'s handler and its reply back."""
        try:
            with anyio.fail_after(timeout_s):
                return await self._exchange(src, dst, payload)
        except TimeoutError as exc:
            raise err.PeerTimeout(f"{dst} did not answer in {timeout_s:g} s") from exc

    async def _exchange(self, src: Address, dst: Address, payload: bytes) -> bytes:
        handler = self._handlers.get(dst)
        if handler is None:
            raise err.PeerUnreachable(f"nothing listens at {dst}")
        await self._carry(src, dst, payload)
        reply = await self._call(handler, payload, src)
        if self.duplicate_rate and self.rng.random() < self.duplicate_rate:
            self.counters.duplicated += 1
            await self._carry(src, dst, payload)
            await self._call(handler, payload, src)  # the copy's reply goes nowhere
        if reply is None:
            raise err.PeerUnreachable(f"{dst} hung up without a reply")
        await self._carry(dst, src, reply)
        return reply

    @staticmethod
    async def _call(handler: Handler, payload: bytes, src: Address) -> bytes | None:
        try:
            return await handler(payload, src)
        except Exception:  # as over TCP: a failing handler is a hang-up, logged
            log.exception("gossip: in-memory handler failed")
            return None


class MemoryTransport:
    """A Transport on a MemoryNetwork."""

    def __init__(self, network: MemoryNetwork, address: Address) -> None:
        self.network = network
        self.address = address

    async def request(self, peer: Address, payload: bytes, timeout_s: float) -> bytes:
        """One exchange through the network."""
        return await self.network.deliver(self.address, peer, payload, timeout_s)

    async def serve(self, handler: Handler, *,
                    task_status: anyio.abc.TaskStatus[Address] = anyio.TASK_STATUS_IGNORED,
                    ) -> None:
        """Answer requests until cancelled."""
        self.network._handlers[self.address] = handler
        try:
            task_status.started(self.address)
            await anyio.sleep_forever()
        finally:
            self.network._handlers.pop(self.address, None)
