"""The one stream relay: an upstream answer's body, chunk by chunk, to a client's `send`.

Forward mode, a provider chain's calls and the mitmproxy addon's relay all stream through
`relay()`: one timer for the whole answer (the request's deadline), each chunk sent as it came
(through the path's `transform`, if any: a translation, a key scrubber) and counted on its way
by the attempt's Measurement, so the client never waits for the bookkeeping. The caller sends
the response start before and the last body part after (`broken_text` says how a stream that
broke off ends: the API's error event). An answer the gateway itself cut as it stops
(`cut_by_us`) is no sample of its route.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterable, Callable
from typing import Literal

from starlette.types import Scope, Send

from meshroute_middleware.chat.attempts import Measurement
from meshroute_middleware.core.kinds import ErrorKind
from meshroute_middleware.forwarding.client import ForwarderClosed, ForwardError

BROKEN_TEXT = "the route failed mid-stream; partial response"
STALLED_TEXT = "the route stalled or the request's deadline ran out; partial response"
# A served request's scope holds its drain state here (app/drain.py: `cut` once the drain
# cut the request short as the server stops).
DRAIN_STATE = "meshroute.drain"


def broken_text(error: str) -> str:
    """What the error event of a stream that broke off with `error` says."""
    return STALLED_TEXT if error == "timeout" else BROKEN_TEXT


def cut_by_us(scope: Scope, exc: BaseException) -> bool:
    """Whether `exc` ends an answer the gateway itself cut as it stops: its forwarder closed
    under the answer (ForwarderClosed), or the drain cut the request (its cancellation). The
    route did nothing: such an answer teaches it nothing, neither a sample nor a failure."""
    if isinstance(exc, ForwarderClosed):
        return True
    return isinstance(exc, asyncio.CancelledError) \
        and getattr(scope.get(DRAIN_STATE), "cut", False) is True


async def relay(send: Send, chunks: AsyncIterable[bytes], deadline: float,
                m: Measurement | None = None,
                transform: Callable[[bytes], bytes] | None = None) -> ErrorKind | Literal[""]:
    """Send each chunk as a body part (`more_body`) until the answer ends (""), breaks (its
    ForwardError's kind) or the loop time `deadline` cuts it ("timeout"). `m` notes the first
    chunk's time and counts each chunk after it was sent (its meter: `m.answer()` first).
    The client's own failure (OSError) and cancellation propagate."""
    meter = None if m is None else m.meter
    timer = asyncio.timeout_at(deadline)  # one timer for the whole answer, not per chunk
    try:
        async with timer:
            async for chunk in chunks:
                if m is not None and m.first is None:
                    m.first = time.perf_counter()
                await send({"type": "http.response.body",
                            "body": chunk if transform is None else transform(chunk),
                            "more_body": True})
                if meter is not None:
                    meter.feed(chunk)
    except ForwardError as exc:
        return exc.kind
    except TimeoutError:
        if not timer.expired():
            raise  # the client's connection, not the deadline
        return "timeout"
    return ""
