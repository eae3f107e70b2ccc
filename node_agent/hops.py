"""Route plans between emulated nodes, and the per-request token stream to the next hop.

A request's hops talk over one long-lived HTTP exchange per link: the upstream hop streams one
line per token in the request body, the downstream hop answers one line per token in the
response body only after its own span (and everything behind it) has run. Tokens are
autoregressive, so a token's work crosses every hop before the next token starts.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import anyio
import anyio.abc

from meshroute_middleware.core.contracts import plan
from meshroute_middleware.core.contracts.error_body import error_message
from meshroute_middleware.core.contracts.plan import PLAN_HEADER, ROUTE_HEADER, PlanHop
from meshroute_middleware.core.prefix import Prefix

from .shard import EmulatorConfig, EmulatorError

HANDSHAKE = b"open"  # the first line upstream sends, so its request leaves at once
HOP_PATH = "/internal/hop"
# The prompt's hash chain for the next hop's prefix cache (issue 26): its last entries as
# "hex hash:cumulative tokens", comma-separated.
PROMPT_HEADER = "x-meshroute-prompt"
PROMPT_ENTRIES = 64
MAX_PROMPT_TOKENS = 10_000_000

__all__ = [
    "HANDSHAKE", "HOP_PATH", "PLAN_HEADER", "PROMPT_HEADER", "ROUTE_HEADER", "HopError",
    "HopLink", "HopOpener", "HopPlanError", "PlanHop", "decode_prompt", "encode_prompt",
    "parse_plan",
]


def encode_prompt(prompt: Prefix) -> str:
    """The header value of a prompt's chain (its last PROMPT_ENTRIES entries)."""
    pairs = list(zip(prompt.hashes, prompt.tokens, strict=True))[-PROMPT_ENTRIES:]
    return ",".join(f"{h:x}:{t}" for h, t in pairs)


def decode_prompt(raw: str | None) -> Prefix | None:
    """The chain a prompt header carries; None when absent or malformed (then the hop
    prefills nothing: a hostile header can only cost its sender)."""
    if not raw:
        return None
    entries = raw.split(",")
    if len(entries) > PROMPT_ENTRIES:
        return None
    hashes, tokens = [], []
    try:
        for entry in entries:
            h, t = entry.split(":")
            if len(h) > 16:
                return None
            hashes.append(int(h, 16))
            tokens.append(int(t))
    except ValueError:
        return None
    if any(not 0 <= t <= MAX_PROMPT_TOKENS for t in tokens) or tokens != sorted(tokens):
        return None
    return Prefix(tuple(hashes), tuple(tokens))


class HopPlanError(EmulatorError):
    """The x-meshroute-plan header is malformed or does not fit this node."""

    status = 400
    kind = "invalid_request_error"


class HopError(EmulatorError):
    """The next hop refused the job or dropped it."""

    status = 502
    kind = "upstream_error"


def parse_plan(raw: str | None, config: EmulatorConfig, *, head: bool) -> list[PlanHop]:
    """The hops from this node on (contracts.plan); the first must be this node within its
    shard, and the plan must end at the model's last layer."""
    if raw is None:
        if not head or not config.covers_model:
            raise HopPlanError(f"node {config.node_id} serves layers {config.start}-{config.end} "
                            f"of {config.layers}: a request needs an {PLAN_HEADER} header")
        return [PlanHop(config.node_id, "", 0, config.layers - 1)]
    try:
        hops = plan.parse_plan(raw)
    except plan.PlanError as exc:
        raise HopPlanError(str(exc)) from None
    _check_fit(hops, config, head=head)
    return hops


def _check_fit(hops: list[PlanHop], config: EmulatorConfig, *, head: bool) -> None:
    me = hops[0]
    if me.node_id != config.node_id:
        raise HopPlanError(f"plan starts at {me.node_id!r}, this is {config.node_id!r}")
    if not config.start <= me.start_layer <= me.end_layer <= config.end:
        raise HopPlanError(f"plan gives {me.node_id} layers {me.start_layer}-{me.end_layer}, "
                        f"it serves {config.start}-{config.end}")
    if head and me.start_layer != 0:
        raise HopPlanError("the head of a plan must start at layer 0")
    if hops[-1].end_layer != config.layers - 1:
        raise HopPlanError(f"plan ends at layer {hops[-1].end_layer}, the model has "
                        f"{config.layers}")


class HopLink:
    """The open token stream to the next hop of one request."""

    def __init__(self, response: aiohttp.ClientResponse,
                 outbox: anyio.abc.ObjectSendStream[bytes]) -> None:
        self._response, self._outbox = response, outbox

    async def step(self, index: int) -> None:
        """Send token `index` downstream and wait until every hop behind has run it."""
        try:
            await self._outbox.send(b"%d\n" % index)
            line = await self._response.content.readline()
        except (aiohttp.ClientError, anyio.BrokenResourceError, anyio.ClosedResourceError,
                OSError) as exc:
            raise HopError(f"next hop dropped the job: {exc!r}") from exc
        if not line.endswith(b"\n"):
            raise HopError("next hop closed the token stream mid-request")


async def _body(inbox: anyio.abc.ObjectReceiveStream[bytes]) -> AsyncIterator[bytes]:
    async with inbox:
        async for item in inbox:
            yield item


async def _refusal(response: aiohttp.ClientResponse) -> str:
    try:
        body = await response.json(content_type=None)
    except (ValueError, aiohttp.ClientError):
        body = None
    return error_message(body) or f"HTTP {response.status}"


class HopOpener:
    """Opens token streams to next hops over one shared aiohttp session."""

    def __init__(self, session: aiohttp.ClientSession) -> None:
        self._session = session

    async def open(self, rest: list[PlanHop], route: str | None,
                   prompt: Prefix | None = None) -> tuple[HopLink, Any]:
        """Open the stream to rest[0]; return the link and a closer to await when done."""
        outbox, inbox = anyio.create_memory_object_stream[bytes](1)
        outbox.send_nowait(HANDSHAKE + b"\n")  # aiohttp holds headers until the first chunk
        headers = {PLAN_HEADER: plan.encode_plan(rest)}
        if route:
            headers[ROUTE_HEADER] = route
        if prompt is not None and prompt.hashes:
            headers[PROMPT_HEADER] = encode_prompt(prompt)
        try:
            response = await self._session.post(rest[0].url + HOP_PATH, data=_body(inbox),
                                                headers=headers)
        except (aiohttp.ClientError, OSError) as exc:
            outbox.close()
            raise HopError(f"cannot reach next hop {rest[0].node_id}: {exc!r}") from exc
        if response.status != 200:
            reason = await _refusal(response)
            outbox.close()
            response.release()
            raise HopError(f"next hop {rest[0].node_id} refused: {reason}")

        async def close() -> None:
            outbox.close()
            response.close()

        return HopLink(response, outbox), close
