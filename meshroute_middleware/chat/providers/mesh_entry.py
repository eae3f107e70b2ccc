"""A mesh entry of a chain: the mesh Router's own attempts (its bandit across the model's
shard routes, forward mode's attempt, the request's deadline), reported to the
ProviderRouter so that the chain ranks mesh and provider routes on the same axes."""

from __future__ import annotations

import json
import time
from typing import Any

from meshroute_middleware.chat.attempts import Attempts, Failed, Measurement
from meshroute_middleware.chat.continuation import can_continue, next_continuing
from meshroute_middleware.chat.failover import GoingOn
from meshroute_middleware.chat.forward import ForwardMode
from meshroute_middleware.chat.gather import Gathering
from meshroute_middleware.chat.providers.call import failure_reason
from meshroute_middleware.chat.providers.ranking import ProviderRanking
from meshroute_middleware.chat.providers.request import ChainRequest
from meshroute_middleware.chat.providers.tally import TallySend
from meshroute_middleware.core import NoRouteError, Router, UnknownModelError
from meshroute_middleware.core.capabilities import UnsupportedCapabilityError
from meshroute_middleware.core.kinds import CONTEXT
from meshroute_middleware.core.providers.chain import mesh_fit
from meshroute_middleware.core.providers.router import ChainAttempt
from meshroute_middleware.core.providers.scoring import OutcomeKind
from meshroute_middleware.http.request import ChatRequest, answer_bound
from meshroute_middleware.telemetry.metrics import Telemetry


class MeshEntry:
    """Runs a chain's mesh entries."""

    def __init__(self, router: Router, telemetry: Telemetry, forward: ForwardMode) -> None:
        self.router, self.telemetry, self.forward = router, telemetry, forward

    async def __call__(self, cr: ChainRequest, got: ChainAttempt, ranking: ProviderRanking,
                       m: Measurement, going: GoingOn | None = None) -> Failed | None:
        """The mesh model's attempts (with `max_tokens` lowered when its `[mesh.MODEL]`
        clamps, core/providers/chain.mesh_fit); None once answered, else why it failed.
        `going`: they continue a provider route's stream (chat/providers/continued.py), on
        the model's routes that can continue it."""
        model = got.candidate.route
        clamp_to = mesh_fit(got.candidate, cr.prompt, cr.asked).max_tokens
        payload = cr.payload if clamp_to is None else clamped(cr.payload, clamp_to)
        cr.tally.clamped = None if clamp_to is None else (clamp_to, cr.asked)
        bound = answer_bound(payload)
        kind, inputs = cr.ex.req.kind, cr.ex.req.inputs
        router = self.router  # the kind's: an embeddings lane has the embeddings Router
        try:
            decision = router.choose(model, None, bound, cr.ex.req.prefix, cr.ex.req.needs,
                                     objective=cr.objective)
        except UnsupportedCapabilityError:  # its nodes changed since the chain was ranked
            return Failed("client_error", "no node has the capabilities", code="capability")
        except (UnknownModelError, NoRouteError) as exc:
            return Failed("connect", str(exc))
        if going is not None and not can_continue(decision.route):
            router.cancel(decision)
            following = next_continuing(router, decision)
            if following is None:
                return Failed("connect", f"no route of {model} can continue the answer",
                              code="capability")
            decision = following
        first = cr.opened[0]
        attempts = Attempts(router, self.telemetry, model, bound, first.timeout_s,
                            deadline=first.deadline, kind=kind, inputs=inputs)
        cr.opened.append(attempts)
        ex = cr.ex
        saved = ex.attempts, ex.req
        ex.attempts = attempts
        ex.req = ChatRequest(_body(payload, model), model, None, bound, kind=kind,
                             inputs=inputs, continues=cr.ex.req.continues,
                             client=cr.ex.req.client)
        # the client's send, under a gathered answer's (chat/providers/continued.gather_whole)
        send = ex.send.client if isinstance(ex.send, Gathering) else ex.send
        assert isinstance(send, TallySend)
        sent = time.perf_counter()
        try:  # the chain's own again after (a provider's failover reads ex.attempts, ex.req)
            if going is None:
                _, failed = await attempts.run(decision, self.forward.attempt, ex)
            else:  # the model's next routes continue it too (ForwardMode's failover)
                going_on = json.loads(going.body)
                body = _body(going_on if clamp_to is None else clamped(going_on, clamp_to),
                             model)
                _, failed = await attempts.run(decision, self.forward.continuing,
                                               GoingOn(ex, body, going.transcript), hedged=False)
        finally:
            ex.attempts, ex.req = saved
        if not ex.started:  # nothing was answered with the lowered bound
            cr.tally.clamped = None
        if failed is not None and failed.kind == CONTEXT:  # the node refused the size
            return failed
        if failed is not None:
            return Failed(failed.kind, failed.reason, code=failure_reason(failed.kind))
        if send.status is not None and 400 <= send.status < 500:
            ranking.outcome(got, OutcomeKind.CLIENT_ERROR)
            return None
        took = attempts.measured
        now = time.perf_counter()
        first_at = took.first if took is not None and took.first is not None else now
        end = took.last if took is not None and took.last is not None else now
        tokens = took.meter.completion_tokens if took is not None and took.meter is not None else 0
        if kind == "embeddings" and took is not None:
            tokens = took.outcome().completion_tokens  # its inputs, once answered whole
        seconds = max(end - sent, 1e-6)  # forwarding to the last byte
        ranking.outcome(got, OutcomeKind.SUCCESS, tokens_per_s=ranking.tps(tokens, seconds),
                        ttfb_ms=(first_at - sent) * 1000)
        return None


def _body(payload: dict[str, Any], model: str) -> bytes:
    """What the mesh model's nodes are sent: the chain's request for `model`."""
    return json.dumps({**{k: v for k, v in payload.items() if k != "route"},
                       "model": model}).encode()


def clamped(payload: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """The request with its answer bound lowered to `max_tokens` (`max_completion_tokens`
    and `max_tokens`, whichever it sets)."""
    keys = [k for k in ("max_completion_tokens", "max_tokens") if k in payload]
    return {**payload, **{k: max_tokens for k in keys or ["max_tokens"]}}
