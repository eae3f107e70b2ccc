"""The tracker's HTTP APIs, by their former home: each lives in its own `http/` module (the
gateway API, the provider chain's, the usage ledger's); this module keeps the import path the
docs show (`from meshroute_middleware.api import GatewayAPI`)."""

from __future__ import annotations

from meshroute_middleware.http.chain_api import ProviderRoutingAPI
from meshroute_middleware.http.gateway_api import GatewayAPI, build_api_app
from meshroute_middleware.http.usage_api import UsageAPI

__all__ = ["GatewayAPI", "ProviderRoutingAPI", "UsageAPI", "build_api_app"]
