"""Who may spend, and what was spent (issue 24): a client's request is admitted against its
rpm/tpm limits and budgets before a route is chosen, and recorded once, at its end, in the
usage ledger, with its true tokens and cost.

Both go through a LimitsStore (state/limits.py): this process's memory, the state file the
`--workers` share (`BEGIN IMMEDIATE`), or Redis (`--limits-store`), so that limits, budgets
and the ledger hold across workers and trackers; the decisions are the core's
(`core/clients_budget.ClientGates`). A store that fails lets requests in (the limits are not
enforced meanwhile, with a warning): refusing every request of every client because the
store is down would be worse. Requests without a client are not metered (the ledger answers
who spent; `/metrics` counts every request already).
"""

from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from starlette.types import Message, Send

from meshroute_middleware.chat.headers import H_ROUTE, is_sse
from meshroute_middleware.core.clients import Client
from meshroute_middleware.core.clients_budget import (
    BUDGET_REASONS,
    NO_ROUTE,
    USAGE,
    Admission,
    ClientGates,
    Spent,
    client_row,
    cost_usd,
    rows_of_request,
)
from meshroute_middleware.core.contracts.retry_text import retry_text
from meshroute_middleware.core.providers.config import ProvidersConfig
from meshroute_middleware.core.providers.keys import Refusal
from meshroute_middleware.core.providers.tokens import estimate
from meshroute_middleware.forwarding.measure import TokenMeter
from meshroute_middleware.http.errors import RequestError
from meshroute_middleware.http.request import ChatRequest
from meshroute_middleware.state.limits import LimitsStore, LimitsStoreDown
from meshroute_middleware.telemetry.metrics import ClientCounters
from meshroute_middleware.telemetry.requests import answered

log = logging.getLogger("meshroute.clients")
Prices = Mapping[str, tuple[float, float]]  # provider route -> (price_in, price_out) USD/Mtok
RETRY_UNKNOWN_S = 60  # a refusal whose end is not known (a request larger than tpm): a minute
_LIMITS = {"rpm": ("rpm", "requests a minute"), "tpm": ("tpm", "tokens a minute"),
           "daily_tokens": ("daily_tokens", "tokens a UTC day"),
           "monthly_usd": ("monthly_usd", "USD a UTC month")}


def prices_of(cfg: ProvidersConfig | None) -> dict[str, tuple[float, float]]:
    """Each provider route's (price_in, price_out); mesh routes are not in it (free)."""
    if cfg is None:
        return {}
    return {f"{p.name}/{m.id}": (m.price_in, m.price_out) for p in cfg.providers
            for m in p.models}


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
        super().__init__(429, f"client {client.name!r} is over its {field} "
                         f"({getattr(client, field)} {unit}); "
                         f"{retry_text(now + self.retry_after_s, now)}",
                         "budget_exceeded" if budget else "client_rate_limited",
                         [(b"retry-after", str(self.retry_after_s).encode())])
        self.reason = refusal.reason


class ClientSpend:
    """Admits clients' requests and records what they spent, in one LimitsStore."""

    def __init__(self, store: LimitsStore, prices: Prices | None = None,
                 counters: ClientCounters | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.store, self.clock = store, clock
        self.prices = dict(prices or {})
        self.counters = counters or ClientCounters()
        self.store_failures = 0
        self._up = True
        self._ids = secrets.randbits(40) << 22  # admission ids unique across processes

    async def admit(self, client: Client, req: ChatRequest, send: Send) -> Metered:
        """`client`'s request admitted: its metered send (ClientRefused when it is over a
        limit or a budget)."""
        try:
            payload = orjson.loads(req.body)
        except orjson.JSONDecodeError:  # parse_chat read it: never here
            payload = {}
        est = estimate(payload if isinstance(payload, dict) else {})
        now = self.clock()
        got = await self._transact(client.name, None,
                                   lambda g: g.admit(client, est.reserve, now), now)
        if isinstance(got, Refusal):
            self.counters.count(client.name, NO_ROUTE, 429, 0, 0, 0.0)
            log.info("clients: refused a request of %s (%s)", client.name, got.reason)
            raise ClientRefused(client, got, now)
        return Metered(self, client, got, est.prompt, send)

    async def settle(self, client: Client, admission: Admission | None, spent: Spent,
                     status: int) -> None:
        """A request ended: counted, and settled in the store with what it used."""
        self.counters.count(client.name, spent.route, status, spent.prompt_tokens,
                            spent.completion_tokens, spent.cost_usd)
        if admission is None:  # admitted while the store was away: nothing to settle
            return
        now = self.clock()
        await self._transact(client.name, spent.route,
                             lambda g: g.settle(admission, spent, now), now)

    def cost(self, route: str, prompt_tokens: int, completion_tokens: int) -> float:
        return cost_usd(prompt_tokens, completion_tokens, self.prices.get(route))

    async def usage_rows(self) -> list[dict[str, Any]]:
        """Every ledger row (GET /v1/usage); LimitsStoreDown when the store is away."""
        return await self.store.scan(USAGE)

    async def spent_now(self, client: str) -> dict[str, float]:
        """A client's counters as the store holds them now (the dashboard, tests)."""
        now = self.clock()
        out = await self.store.transact_with([client_row(client)], self._gates,
                                             lambda g: g.spent(client, now), now, 0)
        spent: dict[str, float] = out.result
        return spent

    async def _transact(self, client: str, route: str | None,
                        op: Callable[[ClientGates], Any], now: float) -> Any:
        self._ids += 1 << 10
        try:
            out = await self.store.transact_with(rows_of_request(client, route, now),
                                                 self._gates, op, now, self._ids)
        except LimitsStoreDown as exc:
            self.store_failures += 1
            if self._up:
                self._up = False
                log.warning("clients: the limits store (%s) failed (%s): clients' limits and "
                            "budgets are not enforced, nor their usage recorded, until it "
                            "answers again", self.store.mode, exc)
            return None
        if not self._up:
            self._up = True
            log.warning("clients: the limits store (%s) answers again", self.store.mode)
        return out.result

    @staticmethod
    def _gates(first_id: int) -> ClientGates:
        return ClientGates(first_id=first_id)


class Metered:
    """The `send` of one admitted client request: reads its answer's status, route and
    `usage` as they pass, and records the request once, when its answer ends or, for an
    answer that never ended, at `close()`."""

    __slots__ = ("_admission", "_client", "_done", "_ended", "_last", "_meter", "_priced",
                 "_prompt_estimate", "_route", "_send", "_spend", "_status")

    def __init__(self, spend: ClientSpend, client: Client, admission: Admission | None,
                 prompt_estimate: int, send: Send) -> None:
        self._spend, self._client, self._admission = spend, client, admission
        self._prompt_estimate, self._send = prompt_estimate, send
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
            self._route, self._priced = ledger_route(
                next((v for k, v in headers if k == H_ROUTE), None))
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
        prompt = meter.prompt_tokens if meter is not None else None
        if prompt is None:  # no usage: the estimate, when a route answered at all
            prompt = self._prompt_estimate if self._status == 200 else 0
        completion = meter.completion_tokens if meter is not None else 0
        # a 429 or 5xx is the gateway's own "no route answered" (routes tried are in its
        # body), whatever x-meshroute-route says was tried last
        route = NO_ROUTE if not self._status or self._status == 429 or self._status >= 500 \
            else self._route
        usd = self._spend.cost(route, prompt, completion) if self._priced else 0.0
        spent = Spent(route, prompt, completion, usd, not ok)
        try:
            await self._spend.settle(self._client, self._admission, spent, self._status or 499)
        except Exception:  # a bug of ours must not fail the answer already given
            log.exception("clients: recording a request's usage failed")
