"""Who may spend, and what was spent (issue 24): a client's request is admitted against its
rpm/tpm limits and budgets before a route is chosen, and recorded once, at its end, in the
usage ledger, with its true tokens and cost.

Both go through a LimitsStore (state/limits.py): this process's memory, the state file the
`--workers` share (`BEGIN IMMEDIATE`), or Redis (`--limits-store`), so that limits, budgets
and the ledger hold across workers and trackers; the decisions are the core's
(`core/clients_budget.ClientGates`). The state file and Redis are wrapped in
`state/fallback.FallbackLimits`: while they fail, decisions are taken on the rows last read
and written back when the store answers again. A bare store that fails (this process's
memory, in tests) lets requests in, with a warning. Requests without a client are not
metered (the ledger answers who spent; `/metrics` counts every request already).

What is spent is metered whatever happens (issue 32): a request reserves its worst case
(tokens and USD, priced at the dearest route it may take) while in flight; a request that
reached an upstream is charged at least its prompt, even when its client left before the
first byte; and every request's end (its settle, or the record of a client without limits)
is written behind its answer, carried by the next admission's transaction or flushed by a
supervised task, and a write the store failed is kept and retried until the store takes it,
never dropped (chat/ledger.py). A client without limits costs no store transaction of its
own; in one process's memory (no state file, no Redis) no client does: the gates are held
live, and decided and written in place.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from starlette.types import Message, Send

from meshroute_middleware.chat.headers import H_ROUTE, is_sse
from meshroute_middleware.chat.ledger import Entry, LedgerWriter, apply, rows_of
from meshroute_middleware.core.clients import Client
from meshroute_middleware.core.clients_budget import (
    BUDGET_REASONS,
    NO_ROUTE,
    Admission,
    ClientGates,
    Spent,
    cost_usd,
    day_of,
    rows_of_request,
)
from meshroute_middleware.core.contracts.retry_text import retry_text
from meshroute_middleware.core.providers.config import ProvidersConfig
from meshroute_middleware.core.providers.keys import Refusal, RowName
from meshroute_middleware.core.providers.tokens import (
    DEFAULT_COMPLETION_TOKENS,
    TokenEstimate,
    estimate,
)
from meshroute_middleware.forwarding.measure import TokenMeter
from meshroute_middleware.http.errors import HttpError, RequestError
from meshroute_middleware.http.request import ChatRequest
from meshroute_middleware.state.limits import LimitsStore, LimitsStoreDown
from meshroute_middleware.telemetry.client_metrics import ClientCounters
from meshroute_middleware.telemetry.requests import answered

log = logging.getLogger("meshroute.clients")
# provider route -> (price_in, price_out[, price_cached_in, price_cache_write]) USD/Mtok
Prices = Mapping[str, tuple[float, ...]]
RETRY_UNKNOWN_S = 60  # a refusal whose end is not known (a request larger than tpm): a minute
_FAILED = object()  # a store transaction that did not happen
REFUSED = HttpError.CLIENT_RATE_LIMITED.status  # the status a refused request is counted under
_LIMITS = {"rpm": ("rpm", "requests a minute"), "tpm": ("tpm", "tokens a minute"),
           "daily_tokens": ("daily_tokens", "tokens a UTC day"),
           "monthly_usd": ("monthly_usd", "USD a UTC month")}


def prices_of(cfg: ProvidersConfig | None) -> dict[str, tuple[float, ...]]:
    """Each provider route's (price_in, price_out, price_cached_in, price_cache_write); mesh
    routes are not in it (free)."""
    if cfg is None:
        return {}
    return {f"{p.name}/{m.id}": (m.price_in, m.price_out, *m.cache_prices)
            for p in cfg.providers for m in p.models}


def caps_of(cfg: ProvidersConfig | None) -> dict[str, int]:
    """Each provider route's `max_output`, where its model states one."""
    if cfg is None:
        return {}
    return {f"{p.name}/{m.id}": m.max_output for p in cfg.providers for m in p.models
            if m.max_output is not None}


def ledger_route(header: bytes | None) -> tuple[str, bool]:
    """The ledger's route from an answer's `x-meshroute-route`, and whether it is priced:
    `provider/model` of a key route (`fastco/big-model#2`, priced), the model of a mesh route
    signature (free), else NO_ROUTE."""
    if not header:
        return NO_ROUTE, False
    text = header.decode("latin-1")
    if "|" in text:  # a mesh signature: model|node[a-b]->...
        return text.partition("|")[0] or NO_ROUTE, False
    return text.rpartition("#")[0] or text, True


class ClientRefused(RequestError):
    """429 `client_rate_limited` (rpm, tpm) or `budget_exceeded`, with a Retry-After."""

    def __init__(self, client: Client, refusal: Refusal, now: float) -> None:
        field, unit = _LIMITS[refusal.reason]
        budget = refusal.reason in BUDGET_REASONS
        until = refusal.until
        self.retry_after_s = (RETRY_UNKNOWN_S if until is None
                              else max(1, math.ceil(until - now)))
        kind = HttpError.BUDGET_EXCEEDED if budget else HttpError.CLIENT_RATE_LIMITED
        super().__init__(kind.status, f"client {client.name!r} is over its {field} "
                         f"({getattr(client, field)} {unit}); "
                         f"{retry_text(now + self.retry_after_s, now)}", kind.code,
                         [(b"retry-after", str(self.retry_after_s).encode())])
        self.reason = refusal.reason


class ClientSpend:
    """Admits clients' requests and records what they spent, in one LimitsStore."""

    def __init__(self, store: LimitsStore, prices: Prices | None = None,
                 counters: ClientCounters | None = None,
                 clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 caps: Mapping[str, int] | None = None) -> None:
        self.store, self.clock = store, clock
        self.prices = dict(prices or {})  # every provider route (price 0: free)
        self.caps = dict(caps or {})  # provider routes' max_output, where stated
        self.counters = counters or ClientCounters()
        self.store_failures = 0
        self._up = True
        self._ids = secrets.randbits(40) << 22  # admission ids unique across processes
        self.ledger = LedgerWriter(store, self._gates, sleep)  # requests' ends, behind
        self._live = self.ledger.live  # one process's gates held live: decided in place
        if self._live is not None:
            self._live.number_from(self._ids)
        self._rows = getattr(store, "reads_rows", True)  # a store that reads named rows

    async def admit(self, client: Client, req: ChatRequest, send: Send,
                    chain: bool = True) -> Metered:
        """`client`'s request admitted: its metered send (ClientRefused when it is over a
        limit or a budget). `chain`: the request goes to provider routes (priced), else to
        the mesh (free). A client without limits is let in with no store transaction: its
        usage is written behind (chat/ledger.py); its prompt is estimated only when its
        answer says no usage (`Metered.close`)."""
        if not client.limited:
            return Metered(self, client, None, None, req, send)
        est = estimate_of(req)
        routes = self.routes_of(req, chain)
        completion = est.max_completion
        if completion is None and not routes:  # the mesh: our default cap
            completion = DEFAULT_COMPLETION_TOKENS
        elif completion is None:  # the upstream's default cap: the largest stated, else ours
            completion = max((self.caps[r] for r in routes if r in self.caps),
                             default=DEFAULT_COMPLETION_TOKENS)
        tokens = est.prompt + completion
        usd = cost_usd(est.prompt, completion, self.worst_price(routes))
        now = self.clock()
        got = await self._admitted(client, tokens, now, usd)
        if isinstance(got, Refusal):
            self.counters.count(client.name, NO_ROUTE, REFUSED, 0, 0, 0.0)
            log.info("clients: refused a request of %s (%s)", client.name, got.reason)
            raise ClientRefused(client, got, now)
        return Metered(self, client, None if got is _FAILED else got, est.prompt, req, send)

    def routes_of(self, req: ChatRequest, chain: bool) -> list[str]:
        """The provider routes `req` may be answered on: its pinned routes or its model when
        they are provider routes, else, on a chain, every provider route; none on the mesh."""
        if req.pin and all(p in self.prices for p in req.pin):
            return req.pin
        if req.model in self.prices:
            return [req.model]
        return list(self.prices) if chain else []

    def worst_price(self, routes: list[str]) -> tuple[float, float] | None:
        """The dearest (price_in, price_out) of `routes` (None: free)."""
        if not routes:
            return None
        return (max(self.prices[r][0] for r in routes), max(self.prices[r][1] for r in routes))

    async def check(self, client: Client) -> None:
        """ClientRefused when `client` is over a limit or a budget already (nothing counted):
        asked before a large body is judged and read, so that work is never done for a
        request its rpm refuses (issue 32)."""
        if not client.limited:
            return
        now = self.clock()
        got = await self._transact(client.name, None, lambda g: g.check(client, 0, now), now)
        if isinstance(got, Refusal):
            raise ClientRefused(client, got, now)

    async def admit_free(self, client: Client) -> None:
        """A request that spends no tokens (`/v1/messages/count_tokens`), counted against
        `client`'s rpm (ClientRefused past it) and in its usage as route `none`."""
        if not client.limited:
            await self.settle(client, None, Spent(NO_ROUTE, 0, 0, 0.0, False), 200)
            return
        now = self.clock()
        got = await self._admitted(client, 0, now)
        if isinstance(got, Refusal):
            self.counters.count(client.name, NO_ROUTE, REFUSED, 0, 0, 0.0)
            raise ClientRefused(client, got, now)
        await self.settle(client, got, Spent(NO_ROUTE, 0, 0, 0.0, False), 200)

    async def settle(self, client: Client, admission: Admission | None, spent: Spent,
                     status: int) -> None:
        """A request ended: counted, and its usage queued for the store (chat/ledger.py:
        written behind, retried until the store takes it)."""
        self.counters.count(client.name, spent.route, status, spent.prompt_tokens,
                            spent.completion_tokens, spent.cost_usd, spent.cached_tokens,
                            spent.cache_write_tokens)
        if client.limited and admission is None:  # admitted while the store was away
            return
        self.ledger.add(client.name, admission, spent, self.clock())

    async def aclose(self) -> None:
        """At shutdown: what waits to be written is flushed once more (chat/ledger.py)."""
        await self.ledger.aclose(self.store.mode)

    async def _admitted(self, client: Client, tokens: int, now: float,
                        usd: float = 0.0) -> Any:
        """`client`'s admission (or refusal) in the store, carrying the ends queued before
        it (so this tracker decides on its own settles); _FAILED when the store is away
        (the ends go back to the queue). On live gates, decided in place: no transaction,
        and no end is ever queued (each is written at once)."""
        if self._live is not None:
            return self._live.admit(client, tokens, now, usd)
        ends = self.ledger.take()
        if not ends:
            return await self._transact(client.name, None,
                                        lambda g: g.admit(client, tokens, now, usd), now)

        def op(g: ClientGates) -> Admission | Refusal:
            apply(g, ends)
            return g.admit(client, tokens, now, usd)

        rows = list(dict.fromkeys([*rows_of_request(client.name, None, now), *rows_of(ends)])
                    ) if self._rows else []
        if not self.store.blocking:  # awaited I/O: a request cancelled meanwhile does not
            # cut the transaction short; the ends go back if it did not take them
            task = asyncio.ensure_future(self._transact_rows(rows, op, now))
            task.add_done_callback(lambda t: self._carried(t, ends))
            return await asyncio.shield(task)
        try:
            got = await self._transact_rows(rows, op, now)
        except BaseException:
            self.ledger.back(ends)
            raise
        if got is _FAILED:
            self.ledger.back(ends)
        return got

    def _carried(self, task: asyncio.Future[Any], ends: list[Entry]) -> None:
        if task.cancelled() or task.exception() is not None or task.result() is _FAILED:
            self.ledger.back(ends)

    def cost(self, route: str, prompt_tokens: int, completion_tokens: int,
             cached_tokens: int = 0, cache_write_tokens: int = 0) -> float:
        price = self.prices.get(route)
        if price is None:
            return 0.0
        return cost_usd(prompt_tokens, completion_tokens, (price[0], price[1]), cached_tokens,
                        cache_write_tokens, (price[2], price[3]) if len(price) >= 4 else None)

    async def usage_rows(self, client: str | None = None,
                         since: float = 0.0) -> list[dict[str, Any]]:
        """The ledger rows of `client` (None: every client's) from the UTC day of `since` on
        (GET /v1/usage), the usage written behind flushed first; LimitsStoreDown when the
        store is away."""
        await self.ledger.flush()
        return await self.store.usage(client, day_of(since))

    async def _transact(self, client: str, route: str | None,
                        op: Callable[[ClientGates], Any], now: float) -> Any:
        """`op`'s result in the store, or _FAILED when the store is away."""
        rows = rows_of_request(client, route, now) if self._rows else []
        return await self._transact_rows(rows, op, now)

    async def _transact_rows(self, rows: list[RowName], op: Callable[[ClientGates], Any],
                             now: float) -> Any:
        self._ids += 1 << 10
        try:
            out = await self.store.transact_with(rows, self._gates, op, now, self._ids)
        except LimitsStoreDown as exc:
            self.store_failures += 1
            if self._up:
                self._up = False
                log.warning("clients: the limits store (%s) failed (%s): clients' limits and "
                            "budgets are not enforced, nor their usage recorded, until it "
                            "answers again", self.store.mode, exc)
            return _FAILED
        if not self._up:
            self._up = True
            log.warning("clients: the limits store (%s) answers again", self.store.mode)
        return out.result

    @staticmethod
    def _gates(first_id: int) -> ClientGates:
        return ClientGates(first_id=first_id)


def estimate_of(req: ChatRequest) -> TokenEstimate:
    """`req`'s token estimate: intake's (`parse_chat`), else from its body (a request
    intake did not estimate: embeddings, completions, a small body of a client without
    limits)."""
    if req.tokens is not None:
        return req.tokens
    try:
        payload = orjson.loads(req.body)
    except orjson.JSONDecodeError:  # parsed before: never here
        payload = {}
    return estimate(payload if isinstance(payload, dict) else {})


class Metered:
    """The `send` of one admitted client request: reads its answer's status, route and
    `usage` as they pass, and records the request once, when its answer ends or, for an
    answer that never ended, at `close()`."""

    __slots__ = ("_admission", "_client", "_done", "_ended", "_last", "_meter", "_priced",
                 "_prompt_estimate", "_req", "_route", "_send", "_spend", "_status")

    def __init__(self, spend: ClientSpend, client: Client, admission: Admission | None,
                 prompt_estimate: int | None, req: ChatRequest, send: Send) -> None:
        """`prompt_estimate`: None to estimate it from `req` if the answer says no usage."""
        self._spend, self._client, self._admission = spend, client, admission
        self._prompt_estimate, self._req, self._send = prompt_estimate, req, send
        self._status, self._route, self._priced = 0, NO_ROUTE, False
        self._meter: TokenMeter | None = None
        self._last = b""
        self._done = self._ended = False

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        final = False
        if kind == "http.response.start":
            self._status = int(message["status"])
            headers = message.get("headers", ())
            route = None
            for name, value in headers:
                if name == H_ROUTE:
                    route = value
                    break
            self._route, self._priced = ledger_route(route)
            self._meter = TokenMeter(streaming=is_sse(headers))
        elif kind == "http.response.body":
            body = message.get("body", b"")
            if self._meter is not None and body:
                self._meter.feed(body)
            final = not message.get("more_body")
            if final:
                self._last, self._ended = body, True
        try:
            await self._send(message)
        finally:
            if final:
                await self.close()

    async def close(self) -> None:
        """Record the request (once): an answer that never ended counts as an error."""
        if self._done:
            return
        self._done = True
        ok = self._ended and answered(self._status, self._last)
        meter = self._meter
        reached = self._req.reached
        if not self._status and reached is not None:  # left before the first byte came
            self._status, (self._route, self._priced) = 499, ledger_route(reached.encode())
        prompt, completion, cached, written = meter.counts() if meter is not None \
            else (None, 0, 0, 0)
        if prompt is None:  # no usage: the estimate, when a route answered (or was sent it)
            prompt = 0
            if self._status in (200, 499):
                prompt = self._prompt_estimate
                if prompt is None:
                    prompt = estimate_of(self._req).prompt
        # a 429 or 5xx is the gateway's own "no route answered" (routes tried are in its
        # body), whatever x-meshroute-route says was tried last
        route = NO_ROUTE if not self._status or self._status == 429 or self._status >= 500 \
            else self._route
        usd = self._spend.cost(route, prompt, completion, cached, written) \
            if self._priced else 0.0
        spent = Spent(route, prompt, completion, usd, not ok, cached, written)
        try:
            await self._spend.settle(self._client, self._admission, spent, self._status or 499)
        except Exception:  # a bug of ours must not fail the answer already given
            log.exception("clients: recording a request's usage failed")
