"""Mid-stream failover on provider routes (issue 34): a provider model whose config declares
`continue = true` may have its broken stream continued on a route of the same model that
declares it too: another key of the same provider model, another provider's model of the same
id, or the chain's mesh model of that name (its routes that can continue), in the chain's order
(chat/failover.py's rule; chat/providers/call.py's and mesh_entry.py's attempts).

An OpenAI-compatible upstream gets the chat request with the text so far as a trailing
assistant message; an Anthropic Messages upstream gets it translated to Messages, where a
trailing assistant turn is a prefill, which Messages refuses to end in whitespace: the
whitespace is cut from the prefill, and from the continuation's start if it says it again.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from meshroute_middleware.chat.attempts import Failed, Measurement
from meshroute_middleware.chat.continuation import Transcript
from meshroute_middleware.chat.dialects import Native
from meshroute_middleware.chat.dialects.wire.anthropic_chat import messages_request
from meshroute_middleware.chat.failover import Broke, GoingOn
from meshroute_middleware.chat.failover import fail_over as fail_over_rule
from meshroute_middleware.chat.gather import Gathering, streamed
from meshroute_middleware.chat.headers import Headers
from meshroute_middleware.chat.providers.messages_api import broken_event, native_of
from meshroute_middleware.chat.providers.ranking import ProviderRanking
from meshroute_middleware.chat.providers.request import ChainRequest
from meshroute_middleware.chat.relay import broken_text
from meshroute_middleware.chat.spend import ClientSpend
from meshroute_middleware.core.kinds import ErrorKind
from meshroute_middleware.core.providers.chain import Candidate, Resolution
from meshroute_middleware.core.providers.exhaustion import Exhaustion, PassedOver
from meshroute_middleware.core.providers.router import ChainAttempt
from meshroute_middleware.telemetry.metrics import Telemetry

Keep = Callable[[Candidate], bool]  # which candidates may continue a stream
GoOn = Callable[[ChainRequest, ProviderRanking, ChainAttempt, Measurement, GoingOn],
                Awaitable[Failed | None]]  # a continuation attempt (ProviderCall.go_on)
# a mesh entry's attempts continuing a stream (MeshEntry.__call__ with `going`)
MeshGoOn = Callable[[ChainRequest, ChainAttempt, ProviderRanking, Measurement, GoingOn],
                    Awaitable[Failed | None]]


@dataclass(frozen=True, slots=True)
class Going:
    """A continuation attempt: the stream it continues, whether its route speaks Messages
    (the request translated, a prefill), and the whitespace cut from that prefill."""

    on: GoingOn
    messages: bool
    cut: str


def may_continue(cr: ChainRequest, c: Candidate) -> bool:
    """Whether a stream of candidate `c` is kept to be continued: its model declares
    `continue` and the request does not say `"meshroute": {"continue": false}`."""
    return cr.ex.req.continues and c.model is not None and c.model.continues


def same_model(c: Candidate) -> Keep:
    """Which candidates may continue a stream of `c`: provider models of its id that
    declare `continue`, and the mesh model of that name (its routes that can continue:
    chat/providers/mesh_entry.py)."""
    def keep(other: Candidate) -> bool:
        if other.provider is None:
            return other.route == c.upstream_model
        return (other.model is not None and other.model.continues
                and other.upstream_model == c.upstream_model)
    return keep


def prefilled(payload: dict[str, Any]) -> tuple[dict[str, Any], str]:
    """A continuation's chat payload for a Messages upstream: its trailing assistant text
    without trailing whitespace, and the whitespace cut."""
    messages = payload.get("messages")
    if not isinstance(messages, list) or not messages:
        return payload, ""
    last = messages[-1]
    if not isinstance(last, dict) or last.get("role") != "assistant" \
            or not isinstance(last.get("content"), str):
        return payload, ""
    text = last["content"]
    kept = text.rstrip()
    return {**payload, "messages": [*messages[:-1], {**last, "content": kept}]}, text[len(kept):]


def continuation(on: GoingOn, c: Candidate) -> tuple[bytes, Going]:
    """The body that continues `on` on candidate `c`, and how: chat as `on` has it, or
    translated to Messages with the prefill's trailing whitespace cut."""
    messages = c.model is not None and c.model.api == "anthropic"
    payload, cut = json.loads(on.body), ""
    if messages:
        payload, cut = prefilled(payload)
        payload = messages_request(payload, c.upstream_model)
    return json.dumps({**payload, "model": c.upstream_model}).encode(), Going(on, messages, cut)


def transcript_of(cr: ChainRequest, got: ChainAttempt, native: Native | None,
                  going: Going | None) -> Transcript | None:
    """A continuation's transcript, told the switch; a new one for a stream that may be
    continued; None for one that may not (a native Messages stream included)."""
    if going is not None:
        transcript = going.on.transcript
        assert transcript.splice is not None
        transcript.splice.going_on(got.route)
        if going.messages:  # Messages does not repeat a prefill: only the cut whitespace
            transcript.splice.echoes(going.cut)
        return transcript
    if native is not None or not may_continue(cr, got.candidate):
        return None
    return Transcript(cr.ex.req.kind)


async def fail_over(cr: ChainRequest, got: ChainAttempt, ranking: ProviderRanking,
                    m: Measurement, transcript: Transcript, error: ErrorKind, held: bytes,
                    go_on: GoOn, mesh: MeshGoOn | None = None,
                    spend: ClientSpend | None = None) -> bool:
    """`got`'s stream broke off after content: continued on the next route of its model that
    can continue it (chat/failover.py's rule), the chain's ranking kept to such routes
    meanwhile. True when the stream was ended there."""
    ex = cr.ex
    if held:  # what the scrubber held back: whole events, the client's
        await ex.send({"type": "http.response.body", "body": held, "more_body": True})
    keep = same_model(got.candidate)
    attempts = ex.attempts
    done = m.meter.completion_tokens if m.meter is not None else 0

    async def following() -> ChainAttempt | None:
        return await ranking.going_on(got, keep)

    async def attempt(nxt: ChainAttempt, m2: Measurement, on: GoingOn) -> Failed | None:
        if nxt.candidate.is_provider:
            return await go_on(cr, ranking, nxt, m2, on)
        if mesh is None:
            return Failed("connect", "no mesh entry here", code="capability")
        return await mesh(cr, nxt, ranking, m2, on)

    attempts.ranking = Continuing(ranking, keep)
    try:
        return await fail_over_rule(
            ex, transcript, Broke(got.route, error, done, chain_body(cr), chain=True), following,
            attempt, broken_event(broken_text(error), False),
            announce=lambda nxt: announce(ranking.telemetry, got, nxt, error), spend=spend)
    finally:
        attempts.ranking = ranking


def gather_whole(cr: ChainRequest, res: Resolution, first: ChainAttempt) -> None:
    """A request not streamed, whose first route may be continued and has another route of
    its model that can continue it, is asked of its routes as a stream and gathered into
    the one JSON answer (chat/gather.py), so that it can be continued too."""
    c = first.candidate
    if not may_continue(cr, c) or native_of(cr, c) is not None:
        return
    keep = same_model(c)
    if not ((c.provider is not None and len(c.provider.keys) > 1)
            or any(keep(o) for o in res.candidates if o.route != c.route)):
        return
    body = streamed(cr.ex.req)
    if body is not None:
        cr.payload = json.loads(body)
        cr.ex.send = Gathering(cr.ex.send, cr.ex.req.kind, cr.tally.headers)


def chain_body(cr: ChainRequest) -> bytes:
    """The chain's chat request as bytes (what a continuation extends)."""
    return json.dumps({k: v for k, v in cr.payload.items() if k != "route"}).encode()


def announce(telemetry: Telemetry, broke: ChainAttempt, following: ChainAttempt,
             error: str) -> None:
    """`meshroute_failovers_total` and a `failover` event, as the mesh's
    (Telemetry.failover) for a provider route."""
    model = broke.candidate.upstream_model
    telemetry.failovers[model] = telemetry.failovers.get(model, 0) + 1
    telemetry.events.publish("failover", {"model": model, "from": broke.route,
                                          "to": following.route, "error": error})


class Continuing:
    """The chain's ranking while its stream is continued: after a continuation that failed,
    the next route is one that can continue it too (`ProviderRanking.going_on`)."""

    def __init__(self, ranking: ProviderRanking, keep: Keep) -> None:
        self.ranking, self.keep = ranking, keep

    @property
    def passed(self) -> list[PassedOver]:
        return self.ranking.passed

    def decided(self, got: ChainAttempt) -> None:
        self.ranking.decided(got)

    def failed(self, got: ChainAttempt, m: Measurement, failed: Failed) -> PassedOver:
        return self.ranking.failed(got, m, failed)

    async def next(self, after: ChainAttempt, failed: Failed) -> ChainAttempt | None:
        return await self.ranking.going_on(after, self.keep)

    def cancel(self, got: ChainAttempt) -> None:
        self.ranking.cancel(got)

    def exhaustion(self) -> Exhaustion:
        return self.ranking.exhaustion()

    def headers(self, last: ChainAttempt | None) -> Headers:
        return self.ranking.headers(last)
