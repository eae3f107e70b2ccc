"""Provider routes in the chat path (issue 12): one request, one chain of provider keys and
mesh models, tried in the ProviderRouter's order until one answers.

- `model` of `auto`, `auto:*` or `<provider>/<model id>` comes here (`ProviderChat.claims`);
  any other model stays on the mesh path, exactly as without provider routes.
- Each route is a provider key attempt (`call.ProviderCall`) or a mesh entry
  (`mesh_entry.MeshEntry`); a key that is rate limited or refused passes to the next key.
- When every key is limited, the chain may wait once for the soonest reset
  (`wait_for_key_s`), never past the request's deadline.
- Every response carries `x-meshroute-route`, `x-meshroute-attempts` and `x-meshroute-tried`
  (`tally`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from starlette.types import Receive, Scope, Send

from meshroute_middleware.chat.attempts import (
    DEFAULT_REQUEST_TIMEOUT_S,
    Attempts,
    Exchange,
    internal_error,
)
from meshroute_middleware.chat.forward import ForwardMode
from meshroute_middleware.chat.keyring import NodeSecrets, Secret
from meshroute_middleware.chat.providers.call import ProviderCall
from meshroute_middleware.chat.providers.mesh_entry import MeshEntry
from meshroute_middleware.chat.providers.outcomes import ChainOutcomes
from meshroute_middleware.chat.providers.request import ChainRequest, header
from meshroute_middleware.chat.providers.tally import Tally, TallySend, with_tried
from meshroute_middleware.chat.watchdog import Watchdog
from meshroute_middleware.core import InvalidPinError, Router, UnknownModelError
from meshroute_middleware.core.capabilities import UnsupportedCapabilityError
from meshroute_middleware.core.providers.chain import (
    Candidate,
    InvalidModelError,
    Resolution,
    mesh_fit,
)
from meshroute_middleware.core.providers.exhaustion import PassedOver
from meshroute_middleware.core.providers.router import ChainAttempt, ProviderRouter
from meshroute_middleware.core.providers.tokens import estimate
from meshroute_middleware.forwarding.client import Forwarder, ForwardTimeouts
from meshroute_middleware.http.errors import DeadlineExceeded, ErrorAnswer, HttpError, RequestError
from meshroute_middleware.http.request import H_SESSION, ChatRequest
from meshroute_middleware.telemetry.metrics import Telemetry, provider_key_families

log = logging.getLogger("meshroute.providers")
WAIT_MARGIN_S = 0.05  # slept past the soonest key reset before trying again
_NEXT_KEY = frozenset({"http_429", "http_401", "http_403"})  # the key failed: try the next key
# Shared key gates take a key in their store (awaited): (candidate, reserve, now, context need)
Acquire = Callable[[Candidate, int, float, int], Awaitable[ChainAttempt | list[PassedOver]]]


@dataclass(frozen=True, slots=True)
class _Lane:
    """What one kind of request ranks by and records into: the ProviderRouter whose
    statistics it reads and writes, its provider call and its mesh entry."""

    providers: ProviderRouter
    call: ProviderCall
    mesh: MeshEntry


class ProviderChat:
    """Serves chat (and completions, embeddings) requests whose model names a provider
    route, `auto` or `auto:*`; embeddings' mesh entries run `embeddings_router` (the
    middleware's, `build_embeddings_router`)."""

    def __init__(self, providers: ProviderRouter, secrets: Mapping[str, tuple[Secret, ...]],
                 forwarder: Forwarder, router: Router, telemetry: Telemetry, *,
                 timeouts: ForwardTimeouts | None = None,
                 request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
                 clock: Callable[[], float] = time.time,
                 rng: random.Random | None = None, acquire: Acquire | None = None,
                 node_keys: NodeSecrets | None = None,
                 embeddings_router: Router | None = None) -> None:
        self.providers, self.router, self.telemetry = providers, router, telemetry
        self.acquire = acquire  # shared key gates (state/shared_gates.py); None: the router's
        self.request_timeout_s = request_timeout_s
        self.clock = clock
        self.rng = rng or random.Random()
        # a mesh entry's node refusing the request's size falls over to the next route
        forward = ForwardMode(forwarder, node_keys=node_keys, size_falls_over=True)

        def lane(ranking: ProviderRouter, mesh_router: Router, kind: str = "chat") -> _Lane:
            outcomes = ChainOutcomes(ranking, telemetry, clock,
                                     mesh_router.config.min_sample_tokens, kind)
            return _Lane(ranking, ProviderCall(ranking, secrets, forwarder, outcomes,
                                               timeouts or ForwardTimeouts(), clock),
                         MeshEntry(mesh_router, telemetry, forward, outcomes))
        # Embeddings rank and record provider routes in statistics of their own (inputs/s),
        # over the same key gates and sessions: a key's limits are the provider's, whatever
        # the endpoint (docs/architecture.md, "Statistics per request kind").
        self.embeddings_providers = ProviderRouter(providers.cfg, providers.gates,
                                                   providers.sessions)
        chat = lane(providers, router)
        self._lanes = {"chat": chat, "completions": chat,
                       "embeddings": lane(self.embeddings_providers,
                                          embeddings_router or router, "embeddings")}
        self._watchdog = Watchdog()
        telemetry.add_collector(lambda: provider_key_families(providers, self.clock()))

    with_tried = staticmethod(with_tried)

    def claims(self, model: str) -> bool:
        """Whether a request for `model` takes the provider chain (else the mesh path)."""
        return (model == "auto" or model.startswith("auto:")
                or self.providers.cfg.names_provider(model))

    async def serve(self, scope: Scope, receive: Receive, send: Send, req: ChatRequest) -> None:
        """Answer one chat request: a route's answer, or why none could give one."""
        tally = Tally([], chain=req.model)
        try:
            res = self.providers.resolve(req.model, self.router.models())
        except (InvalidModelError, UnknownModelError) as exc:
            await ErrorAnswer.of(exc).send(send, tally.headers())
            return
        ex = Exchange(scope, receive, TallySend(send, tally), req,
                      Attempts(self.router, self.telemetry, req.model, req.max_tokens,
                               self.request_timeout_s))
        opened: list[Attempts] = [ex.attempts]
        self.telemetry.in_flight += 1
        task = self._watchdog.watch(ex)
        try:
            await self._serve(ex, res, tally, opened)
        except asyncio.CancelledError:
            if not ex.gone:
                raise
            task.uncancel()  # the client left; nothing more to send
        except (InvalidPinError, RequestError, UnsupportedCapabilityError) as exc:
            await ErrorAnswer.of(exc).send(send, tally.headers())
        except Exception:  # a bug of ours: a JSON error, never a traceback
            if not await internal_error(ex, "routing over providers", tally.headers()):
                raise
        finally:
            self._watchdog.forget(ex)
            self.telemetry.in_flight -= 1
            for attempts in opened:
                attempts.close()

    async def _serve(self, ex: Exchange, res: Resolution, tally: Tally,
                     opened: list[Attempts]) -> None:
        try:
            payload = json.loads(ex.req.body)
        except ValueError:  # parse_chat accepted it with orjson; the stdlib must agree
            raise HttpError.INVALID_JSON.error("request body is not valid JSON") from None
        est = estimate(payload)
        pin = ex.req.pin[0] if ex.req.pin and len(ex.req.pin) == 1 else None
        if ex.req.pin is not None and pin is None:
            raise InvalidPinError("pin one route of the chain: 'route': [\"provider/model\"]")
        cr = ChainRequest(ex, payload, est.reserve, est.context_need,
                          header(ex.scope, H_SESSION), self.clock(), tally, opened,
                          ex.req.objective, est.prompt, est.max_completion)
        needs, serves = ex.req.needs, self.router.serves
        passed = self.providers.incapable(res, needs, serves)  # none capable: 400 here
        for _ in range(2):  # once, and once more after waiting for a key (wait_for_key_s)
            run: list[PassedOver] = []
            ranked = self._lanes[ex.req.kind].providers.rank(
                res, self.clock(), self.rng, pinned=pin, session=cr.session,
                tokens=cr.context_need, needs=needs, mesh_serves=serves,
                objective=ex.req.objective)
            for scored in ranked:
                if await self._candidate(cr, scored.candidate, run) or ex.started:
                    return
            passed = run + [p for p in passed if p.route not in {r.route for r in run}]
            wait = self.providers.wait_for_key(passed, cr.started, self.clock())
            if wait is None or cr.time_to_deadline() <= wait:
                break
            log.info("providers: every key of %r is limited; waiting %.1f s for one",
                     res.model, wait)
            # a hair past the reset: a wake-up exactly on it can still find the key limited
            await asyncio.sleep(min(wait + WAIT_MARGIN_S, cr.time_to_deadline()))
        if opened[0].too_late():
            await self._too_late(cr, passed)
            return
        await self._exhausted(cr, res, passed)

    async def _candidate(self, cr: ChainRequest, c: Candidate,
                         passed: list[PassedOver]) -> bool:
        """Try one candidate (each of its keys in turn after a 429); True once answered."""
        tried = cr.tally.tried
        fit = mesh_fit(c, cr.prompt, cr.asked)
        if not fit.fits:  # larger than its [mesh.MODEL] allows: a route that fits, instead
            passed.append(PassedOver(c.route, "context"))
            log.info("providers: %s passed over (context: max_tokens %s, prompt ~%d tokens)",
                     c.route, cr.asked, cr.prompt)
            return False
        while (self.providers.may_attempt(len(tried), cr.started, self.clock())
               and not cr.opened[0].too_late()):
            got = (self.providers.acquire(c, cr.reserve, self.clock(),
                                          context_tokens=cr.context_need)
                   if self.acquire is None
                   else await self.acquire(c, cr.reserve, self.clock(), cr.context_need))
            if isinstance(got, list):
                passed += got
                return False
            tried.append(got.route)
            lane = self._lanes[cr.ex.req.kind]
            over = await (lane.call(cr, got) if c.is_provider
                          else lane.mesh(cr, got, fit.max_tokens))
            if over is None:
                return True
            if cr.ex.started:  # a client error relayed as it was: the request is over
                return True
            passed.append(over)
            log.info("providers: %s passed over (%s)", over.route, over.reason)
            if over.reason not in _NEXT_KEY or not c.is_provider:
                return False
        return False

    async def _too_late(self, cr: ChainRequest, passed: list[PassedOver]) -> None:
        """The request's deadline ran out before any route answered: 504."""
        first = cr.opened[0]
        log.warning("meshroute: a request for %r ran out of its %g s deadline",
                    first.model, first.timeout_s)
        self.telemetry.reject("request_timeout", "the request's deadline ran out")
        cr.ex.started = True
        await ErrorAnswer.of(DeadlineExceeded(
            f"no route answered within the request's deadline of {first.timeout_s:g} s",
            {p.route: p.reason for p in passed})).send(cr.ex.send, cr.tally.headers())

    async def _exhausted(self, cr: ChainRequest, res: Resolution,
                         passed: list[PassedOver]) -> None:
        """Every route was passed over: the ProviderRouter's account of why."""
        exhausted = self.providers.exhausted(res, passed, self.clock())
        body = json.dumps(exhausted.error_body()).encode()
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode()), *cr.tally.headers(),
                   *((k.lower().encode(), v.encode()) for k, v in exhausted.headers().items())]
        cr.ex.started = True
        send = cr.ex.send
        await send({"type": "http.response.start", "status": exhausted.status,
                    "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})
