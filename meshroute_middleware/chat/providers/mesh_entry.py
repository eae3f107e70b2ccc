"""A mesh entry of a chain: the mesh Router's own attempts (its bandit across the model's
shard routes, forward mode's attempt, the request's deadline), reported to the
ProviderRouter so that the chain ranks mesh and provider routes on the same axes."""

from __future__ import annotations

import json
import time
from typing import Any

from meshroute_middleware.chat.attempts import Attempts
from meshroute_middleware.chat.forward import ForwardMode
from meshroute_middleware.chat.providers.call import failure_reason
from meshroute_middleware.chat.providers.outcomes import ChainOutcomes
from meshroute_middleware.chat.providers.request import ChainRequest
from meshroute_middleware.chat.providers.tally import TallySend
from meshroute_middleware.core import NoRouteError, Router, UnknownModelError
from meshroute_middleware.core.capabilities import UnsupportedCapabilityError
from meshroute_middleware.core.kinds import CONTEXT
from meshroute_middleware.core.providers.exhaustion import PassedOver
from meshroute_middleware.core.providers.router import ChainAttempt
from meshroute_middleware.core.providers.scoring import OutcomeKind
from meshroute_middleware.http.request import ChatRequest, answer_bound
from meshroute_middleware.telemetry.metrics import Telemetry


class MeshEntry:
    """Runs a chain's mesh entries."""

    def __init__(self, router: Router, telemetry: Telemetry, forward: ForwardMode,
                 outcomes: ChainOutcomes) -> None:
        self.router, self.telemetry, self.forward = router, telemetry, forward
        self.outcomes = outcomes

    async def __call__(self, cr: ChainRequest, got: ChainAttempt,
                       clamp_to: int | None = None) -> PassedOver | None:
        """The mesh model's attempts (with `max_tokens` lowered to `clamp_to` when its
        `[mesh.MODEL]` clamps, core/providers/chain.mesh_fit); None once answered, else why
        it was passed over."""
        model = got.candidate.route
        payload = cr.payload if clamp_to is None else clamped(cr.payload, clamp_to)
        cr.tally.clamped = None if clamp_to is None else (clamp_to, cr.asked)
        bound = answer_bound(payload)
        kind, inputs = cr.ex.req.kind, cr.ex.req.inputs
        router = self.router  # the kind's: an embeddings lane has the embeddings Router
        try:
            decision = router.choose(model, None, bound, cr.ex.req.prefix, cr.ex.req.needs,
                                     objective=cr.objective)
        except UnsupportedCapabilityError:  # its nodes changed since the chain was ranked
            return PassedOver(model, "capability")
        except (UnknownModelError, NoRouteError):
            return self.outcomes.failed(got, "connect", cr.session)
        first = cr.opened[0]
        attempts = Attempts(router, self.telemetry, model, bound, first.timeout_s,
                            deadline=first.deadline, kind=kind, inputs=inputs)
        cr.opened.append(attempts)
        ex = cr.ex
        ex.attempts = attempts
        ex.req = ChatRequest(json.dumps({**{k: v for k, v in payload.items()
                                            if k != "route"}, "model": model}).encode(),
                             model, None, bound, kind=kind, inputs=inputs)
        send = ex.send
        assert isinstance(send, TallySend)
        sent = time.perf_counter()
        _, failed = await attempts.run(decision, self.forward.attempt, ex)
        if not ex.started:  # nothing was answered with the lowered bound
            cr.tally.clamped = None
        if failed is not None and failed.kind == CONTEXT:  # the node refused the size
            return self.outcomes.record(got, OutcomeKind.CLIENT_ERROR, reason="context",
                                        session=cr.session)
        if failed is not None:
            return self.outcomes.failed(got, failure_reason(failed.kind), cr.session)
        if send.status is not None and 400 <= send.status < 500:
            self.outcomes.record(got, OutcomeKind.CLIENT_ERROR, session=cr.session)
            return None
        m = attempts.measured
        now = time.perf_counter()
        first_at = m.first if m is not None and m.first is not None else now
        end = m.last if m is not None and m.last is not None else now
        tokens = m.meter.completion_tokens if m is not None and m.meter is not None else 0
        if kind == "embeddings" and m is not None:
            tokens = m.outcome().completion_tokens  # its inputs, once answered whole
        seconds = max(end - sent, 1e-6)  # forwarding to the last byte
        self.outcomes.record(got, OutcomeKind.SUCCESS,
                             tokens_per_s=self.outcomes.tps(tokens, seconds),
                             ttfb_ms=(first_at - sent) * 1000, session=cr.session)
        return None


def clamped(payload: dict[str, Any], max_tokens: int) -> dict[str, Any]:
    """The request with its answer bound lowered to `max_tokens` (`max_completion_tokens`
    and `max_tokens`, whichever it sets)."""
    keys = [k for k in ("max_completion_tokens", "max_tokens") if k in payload]
    return {**payload, **{k: max_tokens for k in keys or ["max_tokens"]}}
