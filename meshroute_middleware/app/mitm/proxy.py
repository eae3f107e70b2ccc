"""MeshRouteAddon: routes the chat requests that pass through mitmproxy, as the gateway does.

A `POST /v1/chat/completions` is parsed (`request.parse_chat`), a route chosen by the same
`Router` the gateway uses, and the request sent to the route's head with the plan headers
(x-meshroute-route / -plan / -mode) and without the client's credentials (authorization,
cookie, proxy-authorization, x-api-key: they were meant for the upstream the client named, not
for a mesh node). Every other request passes untouched, and so does a chat request for a model
no mesh node serves (the upstream the client named may serve it).

Why the addon opens the upstream itself. Fallback must happen before the client sees a byte,
on a refused connection, a timeout, a 5xx or a 429. mitmproxy 11 offers no way to retry a flow
on another server: a failed connection goes to the `error` hook and the client gets a 502
right after it; a 5xx reaches `responseheaders` on a server connection that cannot be swapped;
`replay.client` makes a new flow whose answer goes nowhere near this client; and a response an
addon sets carries a whole body, so answering from an exchange of our own would buffer every
stream. So in the async `request` hook the addon opens the head's answer with the gateway's
`Forwarder` (aiohttp, the same timeouts, the same ForwardError kinds) and walks the ranked
routes until one answers its status line, recording each failure; only then does mitmproxy get
the flow, pointed at the relay on the side server (loopback), which streams that already-open
answer chunk by chunk. Nothing is buffered anywhere: `flow.response.stream` is a callable that
passes each chunk on as it comes and feeds a `TokenMeter` on its way (TTFB, tokens), and the
attempt is recorded in `response` (after the last chunk) or `error` (the client left: before
the first byte that says nothing of the route and is cancelled; after it, what was delivered
is a sample). A client that leaves while the addon still waits for a head cancels that request
(mitmproxy holds a client's close back until a hook returns, so the addon watches the client
connection's state itself). The cost is one loopback hop, paid by every routed request.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mitmproxy import exceptions, http

from meshroute_middleware.app.gateway import load_static_nodes
from meshroute_middleware.app.mitm import options
from meshroute_middleware.app.mitm.flows import (
    CHAT_PATH,
    CREDENTIALS,
    H_MODE,
    H_ROUTE,
    ClientGone,
    RelayedAnswer,
    answer_error,
    forwarded_headers,
    is_chat,
    is_local,
    plan_headers,
    unless_client_leaves,
)
from meshroute_middleware.app.mitm.relay import RELAY_PATH, TICKET_HEADER, Parked, Relay
from meshroute_middleware.app.mitm.side import SideServer, build_side_app
from meshroute_middleware.app.settings import ServeSettings, SettingsError
from meshroute_middleware.chat.attempts import Attempts, Failed, Measurement, retry_at
from meshroute_middleware.chat.headers import OURS, is_sse
from meshroute_middleware.core import (
    Decision,
    InvalidPinError,
    MeshRouteError,
    NoRouteError,
    Router,
    UnknownModelError,
)
from meshroute_middleware.core.capabilities import UnsupportedCapabilityError
from meshroute_middleware.core.objectives import DEFAULT_OBJECTIVE, Objective
from meshroute_middleware.forwarding.client import (
    AiohttpForwarder,
    Forwarder,
    ForwardError,
    UpstreamResponse,
)
from meshroute_middleware.http.errors import INTERNAL_ERROR, ErrorAnswer, HttpError, RequestError
from meshroute_middleware.http.guard import host_matches, host_of, machine_names
from meshroute_middleware.http.request import H_OBJECTIVE, ChatRequest, parse_chat
from meshroute_middleware.mesh import Mesh
from meshroute_middleware.telemetry.metrics import Telemetry

log = logging.getLogger("meshroute.mitm")
LOOPBACK = "127.0.0.1"
_OPTIONS_ERROR: Any = exceptions.OptionsError  # untyped in mitmproxy 11; how mitmdump refuses


class MeshRouteAddon:
    """The mitmproxy addon; `environ` supplies MESHROUTE_* variables (the script passes
    os.environ), `forwarder` replaces the aiohttp one (tests)."""

    def __init__(self, environ: Mapping[str, str] | None = None,
                 forwarder: Forwarder | None = None) -> None:
        self.environ = dict(environ or {})
        self.settings: ServeSettings | None = None
        self.router: Router | None = None
        self.telemetry: Telemetry | None = None
        self.mesh: Mesh | None = None
        self.tracker_id = ""
        self.relay = Relay()
        self.side: SideServer | None = None
        self._forwarder = forwarder
        self.ready = asyncio.Event()  # set once the side server listens
        self._attempts: dict[str, RelayedAnswer] = {}  # flow id -> its streaming answer
        self.chat_hosts: tuple[str, ...] = ()  # hosts whose chat traffic is routed; () all
        self._own = machine_names()  # this machine's names and addresses

    # -- lifecycle ------------------------------------------------------------------
    def load(self, loader: Any) -> None:
        """Register the meshroute_* options."""
        options.register(loader)

    def configure(self, updated: set[str]) -> None:
        """(Re)build the routing state from the options; refused once running."""
        from mitmproxy import ctx

        if "listen_host" in updated and not ctx.options.listen_host:
            # mitmproxy's default is every interface; ours, as for `meshroute serve`, loopback
            log.info("meshroute: the proxy listens on %s (--listen-host 0.0.0.0 opens it to "
                     "the network)", LOOPBACK)
            ctx.options.listen_host = LOOPBACK
        if options.CHAT_HOSTS in updated:
            self.chat_hosts = tuple(getattr(ctx.options, options.CHAT_HOSTS))
        if not any(name.startswith(options.PREFIX) for name in updated):
            return
        if self.side is not None:
            log.warning("meshroute: options changed while running take effect on restart")
            return
        try:
            self._build(options.settings_from(ctx.options, self.environ))
        except (SettingsError, ValueError) as exc:
            raise _OPTIONS_ERROR(f"meshroute: {exc}") from exc

    def _build(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.tracker_id = settings.tracker_id or f"mitm-{uuid.uuid4().hex[:12]}"
        self.router = Router(settings.router, clock=time.time,
                             rng=random.Random(settings.seed), origin=self.tracker_id)
        self.telemetry = Telemetry(self.router)
        self.mesh = Mesh(self.router, self.telemetry, settings.max_nodes)
        if settings.nodes_file:
            load_static_nodes(self.mesh, settings.nodes_file)

    async def running(self) -> None:
        """Start the side server (endpoints, relay, discovery and gossip)."""
        from mitmproxy import ctx

        if self.settings is None:
            self.configure({options.CONFIG})
        assert self.settings is not None and self.mesh is not None
        if self._forwarder is None:
            self._forwarder = AiohttpForwarder(self.settings.forward_timeouts())
        port = int(getattr(ctx.options, options.SIDE_PORT))
        app = build_side_app(self.settings, self.mesh, self.relay, self.tracker_id, port)
        self.side = SideServer(app, port)
        url = await self.side.start()
        self.ready.set()
        log.info("meshroute: tracker %s, policy %s; /v1/routing and /dashboard on %s",
                 self.tracker_id, self.settings.router.policy, url)

    async def done(self) -> None:
        """Stop the side server and release upstream connections."""
        if self.side is not None:
            await self.side.stop()
        if self._forwarder is not None:
            await self._forwarder.aclose()

    # -- request ----------------------------------------------------------------------
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        """Name the proxy's client to this machine's servers; refuse an oversized chat body
        before mitmproxy reads it."""
        if is_local(flow.request.host, self._own):
            # the side server and `meshroute serve` see mitmproxy's loopback address: they
            # trust X-Forwarded-For from it (uvicorn's default), so a proxy client is judged
            # by its own address, never as loopback (docs/security.md, the mitm addon)
            peer = flow.client_conn.peername
            flow.request.headers["x-forwarded-for"] = str(peer[0]) if peer else "unknown"
        if not self._routes(flow) or self.settings is None:
            return
        declared = flow.request.headers.get("content-length", "")
        limit = self.settings.max_body_bytes
        if declared.isdigit() and int(declared) > limit:
            answer_error(flow, ErrorAnswer.of(HttpError.REQUEST_TOO_LARGE.error(
                f"request body exceeds the limit of {limit} bytes")))

    async def request(self, flow: http.HTTPFlow) -> None:
        """Route a chat request: choose, open the head's answer with fallback, relay it."""
        if not self._routes(flow) or flow.response is not None or self.router is None:
            return
        try:
            body = flow.request.get_content(strict=True) or b""
        except ValueError:  # an undecodable Content-Encoding
            answer_error(flow, ErrorAnswer.of(HttpError.INVALID_REQUEST.error(
                "request body cannot be decoded")))
            return
        try:
            await self._route(flow, body)
        except Exception:  # a bug of ours: a JSON error, never the flow sent on unrouted
            log.exception("meshroute: internal error while routing a chat request")
            if flow.id not in self._attempts:
                answer_error(flow, INTERNAL_ERROR)

    def _routes(self, flow: http.HTTPFlow) -> bool:
        """Whether this flow is a chat request the addon may route (`meshroute_chat_hosts`:
        every host when empty)."""
        return is_chat(flow) and (not self.chat_hosts or any(
            host_matches(p, host_of(flow.request.host)) for p in self.chat_hosts))

    async def _route(self, flow: http.HTTPFlow, body: bytes) -> None:
        try:
            if self.settings is not None and len(body) > self.settings.max_body_bytes:
                raise HttpError.REQUEST_TOO_LARGE.error(
                    "request body exceeds the limit of "
                    f"{self.settings.max_body_bytes} bytes")
            objective = flow.request.headers.get(H_OBJECTIVE.decode())
            req = parse_chat(body, None if objective is None else objective.encode("latin-1"))
            decision = self._decide(req.model, req.pin, req.max_tokens, req.needs,
                                    req.objective)
        except (RequestError, NoRouteError, UnsupportedCapabilityError) as exc:
            answer_error(flow, ErrorAnswer.of(exc))
            return
        except _PassThrough:
            return
        await self._open(flow, req, decision)

    def _decide(self, model: str, pin: list[str] | None, max_tokens: int | None,
                needs: frozenset[str] = frozenset(),
                objective: Objective = DEFAULT_OBJECTIVE) -> Decision:
        assert self.router is not None
        try:
            return self.router.choose(model, pin, max_tokens, needs=needs, objective=objective)
        except UnknownModelError as exc:
            if pin is None:
                raise _PassThrough from exc  # not the mesh's model: the named upstream's
            raise HttpError.MODEL_NOT_FOUND.error(
                f"model {model!r} is not served by any known route") from exc
        except InvalidPinError as exc:
            raise HttpError.INVALID_ROUTE.error(str(exc)) from exc

    async def _open(self, flow: http.HTTPFlow, req: ChatRequest, first: Decision) -> None:
        """Walk the ranked routes (chat.attempts' lifecycle and deadline) until a head
        answers its status line; relay that answer, or say why none did."""
        assert self.router is not None and self.telemetry is not None
        assert self.settings is not None
        attempts = Attempts(self.router, self.telemetry, req.model, req.max_tokens,
                            self.settings.request_timeout_s)
        pending = _Pending(flow, req.body, forwarded_headers(flow.request.headers.fields),
                           attempts)
        self.telemetry.in_flight += 1
        try:
            _, failed = await attempts.run(first, self._attempt, pending)
            if failed is not None:
                answer, headers = attempts.exhausted(failed)
                answer_error(flow, answer, headers)
        except ClientGone:
            pass  # it says nothing about the route: cancelled below
        finally:
            if flow.id not in self._attempts:  # answered already (an error) or abandoned
                self.telemetry.in_flight -= 1
                attempts.close()

    async def _attempt(self, decision: Decision, m: Measurement,
                       pending: _Pending) -> Failed | None:
        """One attempt at `decision`'s head, within the request's deadline."""
        assert self._forwarder is not None
        try:
            async with asyncio.timeout_at(pending.attempts.deadline):
                upstream = await unless_client_leaves(pending.flow, self._forwarder.open(
                    decision.route.head.url + CHAT_PATH, pending.body,
                    pending.headers + plan_headers(decision)))
        except ForwardError as exc:
            return Failed(exc.kind, str(exc), retry_at=retry_at(exc.retry_after))
        except TimeoutError:
            return Failed("timeout", "no answer within the request's deadline")
        self._relay(pending, decision, upstream, m)
        return None

    def _relay(self, pending: _Pending, decision: Decision, upstream: UpstreamResponse,
               m: Measurement) -> None:
        """Point the flow at the relay, which streams the opened answer."""
        assert self.side is not None and self.router is not None
        flow = pending.flow
        parked = Parked(upstream, is_sse(upstream.headers), deadline=pending.attempts.deadline)
        answer = RelayedAnswer(decision, m, parked, self.relay.park(parked),
                               m.answer(upstream.headers), pending.attempts,
                               client_error=400 <= upstream.status < 500)
        if answer.client_error:
            self.router.cancel(decision)  # the client's own mistake says nothing of the route
        self._attempts[flow.id] = answer
        req = flow.request
        for name in CREDENTIALS:  # never kept in the flow either, nor sent to the relay
            req.headers.pop(name, None)
        for key, value in plan_headers(decision):
            req.headers[key.decode()] = value.decode()
        req.headers[TICKET_HEADER.decode()] = answer.ticket
        req.scheme, req.host, req.port = "http", "127.0.0.1", self.side.port
        req.path = RELAY_PATH
        flow.metadata["meshroute"] = {
            "signature": decision.signature, "mode": decision.mode,
            "attempt": decision.attempt, "head": decision.route.head.url,
            "passed_over": [p.to_dict() for p in pending.attempts.passed]}

    # -- response ---------------------------------------------------------------------
    def responseheaders(self, flow: http.HTTPFlow) -> None:
        """Stream a routed answer through the meter; tell the client the route and mode."""
        answer = self._attempts.get(flow.id)
        if answer is None or flow.response is None:
            return
        flow.response.stream = answer.chunk
        headers = flow.response.headers
        for name in [k for k in headers if k.lower().startswith(OURS.decode())]:
            headers.pop(name, None)
        headers[H_ROUTE] = answer.decision.signature
        headers[H_MODE] = answer.decision.mode

    def response(self, flow: http.HTTPFlow) -> None:
        """The routed answer ended: record it."""
        answer = self._pop(flow)
        if answer is None or answer.client_error:
            return
        if not answer.parked.fetched:  # the ticket expired first: our delay, not the route's
            assert self.router is not None
            self.router.cancel(answer.decision)
            return
        answer.attempts.record(answer.decision, answer.outcome(answer.parked.error))

    def error(self, flow: http.HTTPFlow) -> None:
        """The flow failed: its client left, or the relay broke. Settle the attempt."""
        answer = self._pop(flow)
        if answer is None:
            return
        self.relay.discard(answer.ticket)
        answer.parked.close()
        assert self.router is not None
        if answer.measurement.first is None or answer.client_error:
            self.router.cancel(answer.decision)  # nothing delivered: nothing learned
            return
        answer.attempts.record(answer.decision, answer.outcome(answer.parked.error))

    def _pop(self, flow: http.HTTPFlow) -> RelayedAnswer | None:
        answer = self._attempts.pop(flow.id, None)
        if answer is not None and self.telemetry is not None:
            self.telemetry.in_flight -= 1
        return answer


class _PassThrough(MeshRouteError):
    """A chat request for a model the mesh does not serve: leave it to its upstream."""


@dataclass(slots=True, eq=False)
class _Pending:
    """A chat flow waiting for a head: what each of its attempts sends."""

    flow: http.HTTPFlow
    body: bytes
    headers: list[tuple[bytes, bytes]]
    attempts: Attempts
