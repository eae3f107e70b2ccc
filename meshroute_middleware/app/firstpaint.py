"""What the dashboard's first paint shows beside the routes (issue 33): the provider chains
and the usage ledger, put into the page as the routes are, so that their panels do not wait
for the page's first polls (`GET /v1/routing/chain` per chain, `GET /v1/usage`).

The documents are those endpoints' own: each chain as `/v1/routing/chain?model=M` answers it
(kept when it says more than a mesh route does: several routes or a provider one, as the page
keeps them), the usage as `/v1/usage?group_by=client,route` answers an admin. Usage goes into
the page only for whom `/v1/usage` would show it without a key (its own rule, `open_to`: a
loopback browser of a gateway with no admin token); anyone else's page fetches it, with its
token, as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.requests import Request

from meshroute_middleware.core import UnknownModelError
from meshroute_middleware.core.clients_budget import usage_report
from meshroute_middleware.core.objectives import DEFAULT_OBJECTIVE
from meshroute_middleware.core.providers.chain import InvalidModelError
from meshroute_middleware.http.usage_api import UsageAPI
from meshroute_middleware.state.limits import LimitsStoreDown

if TYPE_CHECKING:
    from meshroute_middleware.app.gateway import Gateway

USAGE_GROUPS = ("client", "route")  # the page's own query (static/dashboard.html)


class FirstPaint:
    """`await first_paint(request)`: {"chains": {model: view}, "usage": rows}, each present
    when there is something to show; read from `gateway` as it is now (a reload included),
    the usage as `usage` (the gateway's `/v1/usage`) shows it."""

    def __init__(self, gateway: Gateway, usage: UsageAPI) -> None:
        self.gateway, self.usage_api = gateway, usage

    async def __call__(self, request: Request) -> dict[str, Any]:
        out: dict[str, Any] = {}
        chains = await self.chains()
        if chains:
            out["chains"] = chains
        usage = await self.usage(request)
        if usage:
            out["usage"] = usage
        return out

    def chain_models(self) -> list[str]:
        """The chains /v1/models lists (`auto`, `auto:<profile>`), then the mesh models."""
        providers, router = self.gateway.providers, self.gateway.router
        if providers is None:
            return []
        cfg = providers.cfg
        active = cfg.profile(cfg.routing.profile) if cfg.routing.profile else None
        names = ["auto"] if (active.chain if active is not None else cfg.routing.chain) else []
        names += [f"auto:{p.name}" for p in cfg.profiles]
        return list(dict.fromkeys([*names, *sorted(router.models())]))

    async def chains(self) -> dict[str, Any]:
        gw = self.gateway
        if gw.providers is None:
            return {}
        now = gw.clock()
        if gw.gates is not None:
            await gw.gates.refresh(now)
        out = {}
        for model in self.chain_models():
            try:
                res = gw.providers.resolve(model, gw.router.models())
            except (InvalidModelError, UnknownModelError):
                continue
            view = gw.providers.chain_view(res, now, DEFAULT_OBJECTIVE)
            chain = view.get("chain", [])
            if len(chain) > 1 or any(c.get("kind") == "provider" for c in chain):
                out[model] = view
        return out

    async def usage(self, request: Request) -> list[dict[str, Any]] | None:
        spend = self.usage_api.spend
        if spend is None or not self.usage_api.open_to(request):
            return None
        try:
            rows = await spend.usage_rows(None, 0.0)
        except LimitsStoreDown:
            return None
        return usage_report(rows, USAGE_GROUPS)
