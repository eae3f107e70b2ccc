"""Provider routes in the chat path (issue 12): one request, one chain of provider keys and
mesh models, tried in the ProviderRouter's order until one answers.

- `model` of `auto`, `auto:*` or `<provider>/<model id>` comes here (`ProviderChat.claims`);
  any other model stays on the mesh path, exactly as without provider routes.
- Each route is a provider key attempt (`call.ProviderCall`) or a mesh entry
  (`mesh_entry.MeshEntry`); a key that is rate limited or refused passes to the next key.
- When every key is limited, the chain may wait once for the soonest reset
  (`wait_for_key_s`), never past the request's deadline.
- The chain runs the one attempt lifecycle (chat.attempts.Attempts) over the ProviderRouter's
  ranking (`ranking.ProviderRanking`): the loop, the deadline and the exhaustion answer are
  every path's.
- Every response carries `x-meshroute-route`, `x-meshroute-attempts` and `x-meshroute-tried`
  (`tally`).
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from starlette.types import Receive, Scope, Send

from meshroute_middleware.chat.attempts import (
    DEFAULT_REQUEST_TIMEOUT_S,
    Attempts,
    Exchange,
    internal_error,
)
from meshroute_middleware.chat.forward import ForwardMode
from meshroute_middleware.chat.hedge import Hedging
from meshroute_middleware.chat.keyring import NodeSecrets, Secret
from meshroute_middleware.chat.providers.call import ProviderCall
from meshroute_middleware.chat.providers.continued import gather_whole
from meshroute_middleware.chat.providers.mesh_entry import MeshEntry
from meshroute_middleware.chat.providers.ranking import Acquire, ProviderRanking
from meshroute_middleware.chat.providers.request import ChainRequest, header
from meshroute_middleware.chat.providers.tally import Tally, TallySend, with_tried
from meshroute_middleware.chat.spend import ClientSpend
from meshroute_middleware.chat.watchdog import Watchdog
from meshroute_middleware.core import InvalidPinError, Router, UnknownModelError
from meshroute_middleware.core.capabilities import UnsupportedCapabilityError
from meshroute_middleware.core.providers.chain import InvalidModelError, Resolution
from meshroute_middleware.core.providers.router import ProviderRouter
from meshroute_middleware.core.providers.tokens import estimate
from meshroute_middleware.forwarding.client import Forwarder, ForwardTimeouts
from meshroute_middleware.http.errors import ErrorAnswer, HttpError, RequestError
from meshroute_middleware.http.request import H_SESSION, ChatRequest
from meshroute_middleware.telemetry.metrics import Telemetry, provider_key_families

log = logging.getLogger("meshroute.providers")


@dataclass(frozen=True, slots=True)
class _Lane:
    """What one kind of request ranks by and records into: the ProviderRouter whose
    statistics it reads and writes, its provider call and its mesh entry."""

    providers: ProviderRouter
    call: ProviderCall
    mesh: MeshEntry
    min_sample_tokens: int
    kind: str


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
                 embeddings_router: Router | None = None,
                 hedging: Hedging | None = None, spend: ClientSpend | None = None) -> None:
        self.providers, self.router, self.telemetry = providers, router, telemetry
        self.hedging = hedging  # hedged first tokens (chat/hedge.py), when configured
        self.acquire = acquire  # shared key gates (state/shared_gates.py); None: the router's
        self.request_timeout_s = request_timeout_s
        self.clock = clock
        self.rng = rng or random.Random()
        # a mesh entry's node refusing the request's size falls over to the next route
        forward = ForwardMode(forwarder, node_keys=node_keys, size_falls_over=True, spend=spend)

        def lane(ranking: ProviderRouter, mesh_router: Router, kind: str = "chat") -> _Lane:
            call = ProviderCall(ranking, secrets, forwarder, timeouts or ForwardTimeouts(),
                                clock, spend)
            call.mesh = MeshEntry(mesh_router, telemetry, forward)  # it continues streams too
            return _Lane(ranking, call, call.mesh, mesh_router.config.min_sample_tokens, kind)
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
                               self.request_timeout_s, kind=req.kind, inputs=req.inputs))
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
        est = ex.req.tokens  # intake's, when a client's admission read it: counted once
        est = estimate(payload) if est is None else est
        if ex.req.pin is not None and len(ex.req.pin) != 1:
            raise InvalidPinError("pin one route of the chain: 'route': [\"provider/model\"]")
        cr = ChainRequest(ex, payload, est.reserve, est.context_need,
                          header(ex.scope, H_SESSION), self.clock(), tally, opened,
                          ex.req.objective, est.prompt, est.max_completion)
        lane = self._lanes[ex.req.kind]
        serves = self.router.serves
        ranking = ProviderRanking(
            cr, res, lane.providers, self.providers, self.telemetry,
            passed=self.providers.incapable(res, ex.req.needs, serves),  # none capable: 400
            clock=self.clock, rng=self.rng, acquire=self.acquire, serves=serves,
            min_sample_tokens=lane.min_sample_tokens, kind=lane.kind,
            call=lane.call, mesh=lane.mesh)
        attempts = ex.attempts
        attempts.ranking = ranking
        if self.hedging is not None:
            attempts.hedge = self.hedging.for_request(ex.req.model, ex, chain=True)
        first = await ranking.first()
        failed = None
        if first is not None:
            gather_whole(cr, res, first)  # a whole answer that may be continued: from a stream
            _, failed = await attempts.run(first, ranking.attempt, cr)
            if failed is None or ex.started:
                return
        ex.started = True
        await attempts.send_exhausted(ex.send, None, failed)
