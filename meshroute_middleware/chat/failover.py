"""The one rule of mid-stream failover (issue 34), for mesh routes (chat/forward.py) and
provider routes (chat/providers/call.py) alike: a stream that broke off after content reached
its client goes on on the next route that can continue it, when what it told the client can
be continued (chat/continuation.py says what cannot); else the caller ends it with the API's
error event, as before.

The continuation is an attempt of the request's own lifecycle (`Attempts.run`, without a
hedge race: it runs inside the attempt that broke), so it is decided, recorded, fallen back
from and bounded by the request's deadline like any attempt. A limited client's continuation
is first reserved against its limits and budgets with its own request, whose prompt holds
the text so far (`reserved`; refused: not continued), as a hedge is; what it spent is the
answer's, whose usage sums the attempts. Its answer is spliced into the
stream the client is reading (`Splice`); a continuation that fails mid-way is continued in
turn, and when no route took it the stream ends with the error event here.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from typing import TypeVar

from starlette.types import Message

from meshroute_middleware.chat.attempts import Exchange, RouteAttempt
from meshroute_middleware.chat.continuation import (
    Splice,
    Transcript,
    constrained,
    continuation_body,
)
from meshroute_middleware.chat.spend import ClientRefused, ClientSpend, Metered
from meshroute_middleware.core.kinds import ErrorKind

log = logging.getLogger("meshroute.failover")
D = TypeVar("D")


@dataclass(frozen=True, slots=True)
class GoingOn:
    """A stream being continued: its exchange, the request body that continues it (the
    chat request plus the text relayed so far), its transcript."""

    ex: Exchange
    body: bytes
    transcript: Transcript


@dataclass(frozen=True, slots=True)
class Broke:
    """A stream that broke off: the route it broke on (as `routes` names it), how, the tokens
    its attempt delivered, and the request body it was sent (a chain's: the chat payload)."""

    route: str
    error: ErrorKind
    tokens: int
    body: bytes
    chain: bool = False  # a provider route's (priced), not a mesh route's (free)


async def fail_over(ex: Exchange, transcript: Transcript, broke: Broke,
                    following: Callable[[], Awaitable[D | None]],
                    attempt: RouteAttempt[D, GoingOn], end: bytes, *,
                    echo: bool = True,
                    announce: Callable[[D], None] | None = None,
                    spend: ClientSpend | None = None) -> bool:
    """Continue the stream `broke` left on `following()`'s route (begun: its reservation
    taken; None when there is none) by `attempt`. True when the stream was ended here
    (continued, or its continuation failed too and `end`, the API's error event, was sent);
    False when it cannot be continued: the caller ends it. `echo`: the next route may repeat
    the text relayed so far before its own (a chat prefill: llama.cpp's server does)."""
    attempts = ex.attempts
    partial = transcript.partial()
    why = (partial.refusal
           or ("its format is constrained" if constrained(broke.body) else "")
           or ("the request's deadline ran out" if attempts.too_late() else ""))
    splice = transcript.splice
    body = continuation_body(broke.body, ex.req.kind, partial.text,
                             broke.tokens + (sum(splice.done) if splice is not None else 0))
    if body is None:
        why = why or "its prompt is not one string"
    held = None if why or body is None else await reserved(spend, ex, body, broke.chain)
    if held is None:
        why = why or "its client is over a limit"
    try:  # the reservation ends however this does (a cut while the next route is chosen)
        nxt = None if why or body is None else await following()
        if nxt is None or body is None:
            log.info("meshroute: %s broke off mid-stream (%s); not continued: %s", broke.route,
                     broke.error, why or "no other route can continue it")
            return False
        if splice is None:
            splice = transcript.splice = Splice(partial, [broke.route])
        splice.switch(broke.route, broke.error, broke.tokens,
                      partial.text if echo and ex.req.kind == "chat" else "")
        transcript.restart()
        if announce is not None:
            announce(nxt)
        _, failed = await attempts.run(nxt, attempt, GoingOn(ex, body, transcript),
                                       hedged=False)
    finally:
        if isinstance(held, Metered):
            await held.close()
    if failed is not None and not ex.gone:
        try:
            await ex.send({"type": "http.response.body", "more_body": False, "body": end})
        except OSError:
            ex.gone = True
    return True


async def reserved(spend: ClientSpend | None, ex: Exchange, body: bytes,
                   chain: bool) -> Metered | bool | None:
    """A continuation's reservation against a limited client's limits and budgets, made
    with the request that continues (`body`); True when there is none to make, None when
    refused. Its `close()` ends it, spending nothing of its own."""
    client = ex.req.client
    if spend is None or client is None or not client.limited:
        return True
    try:
        return await spend.admit(client, replace(ex.req, body=body, tokens=None, reached=None),
                                 _nowhere, chain)
    except ClientRefused:
        return None


async def _nowhere(message: Message) -> None:
    """A reservation's own admission answers nobody."""
