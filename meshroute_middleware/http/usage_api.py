"""`GET /v1/usage` (issue 24): the usage ledger, summed, for whom the caller may see."""

from __future__ import annotations

import hmac
import math
import time
from collections.abc import Sequence
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from meshroute_middleware.core.clients import Client, find_client
from meshroute_middleware.core.clients_budget import GROUPS, usage_report
from meshroute_middleware.http.access import is_loopback_client
from meshroute_middleware.http.auth import presented_keys
from meshroute_middleware.http.errors import HttpError
from meshroute_middleware.state.limits import LimitsStoreDown

__all__ = ["UsageAPI", "UsageLedger"]


class UsageLedger(Protocol):
    """Where usage rows come from (chat/spend.py's ClientSpend)."""

    async def usage_rows(self, client: str | None = None,
                         since: float = 0.0) -> list[dict[str, Any]]:
        """The ledger rows of `client` (None: every client's) from the UTC day of `since` on;
        LimitsStoreDown when the store is away."""
        ...


class UsageAPI:
    """`GET /v1/usage?client=NAME&since=UNIX&group_by=client|route|day` (issue 24): the usage
    ledger summed by client, route or UTC day (or a comma list of them), from the UTC day of
    `since` on. The admin token (`--admin-token`; without one, a loopback client) sees every
    client; a client's own key (`Authorization: Bearer` or `x-api-key`) sees its own rows
    only, and naming another client is a 403."""

    def __init__(self, spend: UsageLedger | None, clients: Sequence[Client] = (), *,
                 admin_token: str | None = None) -> None:
        self.spend, self.admin_token = spend, admin_token
        self.clients = tuple(clients)

    def routes(self) -> list[Route]:
        return [Route("/v1/usage", self.usage, methods=["GET"])]

    async def usage(self, request: Request) -> Response:
        """The ledger's rows for whom the caller may see."""
        who = self._caller(request)
        if isinstance(who, Response):
            return who
        query = request.query_params
        client = query.get("client") or None
        if who is not None:
            if client is not None and client != who.name:
                return HttpError.FORBIDDEN.response("a client's key sees its own usage only")
            client = who.name
        try:
            since = float(query.get("since", "0"))  # given empty (`since=`): refused
        except ValueError:
            since = math.nan
        if not (math.isfinite(since) and since >= 0):
            return HttpError.INVALID_SINCE.response("'since' must be UNIX seconds (a number >= 0)")
        groups = tuple((query.get("group_by") or "client").split(","))
        if not groups or any(g not in GROUPS for g in groups) or len(set(groups)) < len(groups):
            return HttpError.INVALID_GROUP_BY.response(
                "'group_by' is client, route or day (or a comma list "
                "of them)")
        try:
            rows = [] if self.spend is None else await self.spend.usage_rows(client, since)
        except LimitsStoreDown as exc:
            return HttpError.LIMITS_STORE_UNAVAILABLE.response(
                f"the usage ledger is not available: {exc}")
        data = usage_report(rows, groups, client=client, since=since)
        for row in data:
            if "day" in row:
                row["date"] = time.strftime("%Y-%m-%d", time.gmtime(row["day"] * 86400))
        return JSONResponse({"object": "list", "group_by": ",".join(groups), "since": since,
                             "client": client, "data": data})

    def open_to(self, request: Request) -> bool:
        """Whether `request` sees every client's usage without a key: it presents none, no
        admin token is set and its peer is loopback (the one rule: the dashboard's first
        paint asks it too, app/firstpaint.py)."""
        return (not self.admin_token and is_loopback_client(request)
                and not presented_keys(request.scope.get("headers", ())))

    def _caller(self, request: Request) -> Client | Response | None:
        """The client whose key this is; None for the admin; else the 401 to answer."""
        keys = presented_keys(request.scope.get("headers", ()))  # the chat path's one reader
        if not keys:
            if self.open_to(request):
                return None
            return HttpError.MISSING_API_KEY.response(
                "/v1/usage needs the admin token or a client's key "
                "(Authorization: Bearer KEY or x-api-key)")
        given = keys[0]
        if self.admin_token and hmac.compare_digest(given, self.admin_token.encode()):
            return None
        found = find_client(self.clients, given)  # every digest compared, in constant time
        if found is not None:
            return found
        return HttpError.INVALID_API_KEY.response(
            "the key is neither the admin token nor a client's")
