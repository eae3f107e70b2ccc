"""Issue 11, item 8: said out loud. The start line says what is open; /v1/routing warns."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

import httpx
import pytest

from meshroute_middleware.app.config import GatewayConfig, exposure
from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.services import background_services
from meshroute_middleware.app.settings import ServeSettings

from ..conftest import FakeClock

pytestmark = pytest.mark.anyio


def line(**settings: Any) -> str:
    return exposure(GatewayConfig.build(replace(ServeSettings(), **settings)))


def test_defaults_say_unsigned_mdns_and_loopback_writes() -> None:
    text = line()
    assert "node writes: loopback clients only" in text
    assert "mDNS: on all, records UNSIGNED" in text
    assert "gossip: off" in text and "max 1024 nodes" in text


def test_locked_down_says_so() -> None:
    text = line(node_token="t", mesh_secret="s", mdns_interfaces="10.0.0.2",
                gossip_listen="10.0.0.2:7946", gossip_secret="g")
    assert "node writes: bearer token" in text
    assert "mDNS: on 10.0.0.2, records must be signed" in text
    assert "gossip: 10.0.0.2:7946, authenticated" in text


def test_insecure_gossip_is_named() -> None:
    text = line(gossip_listen="0.0.0.0:7946", insecure_gossip=True)
    assert "NOT authenticated (--insecure-gossip)" in text
    assert "not authenticated (loopback only)" in line(gossip_listen="127.0.0.1:7946")


async def test_the_line_is_logged_once_at_start(caplog: pytest.LogCaptureFixture) -> None:
    gw = build_gateway(replace(ServeSettings(), mdns=False), clock=FakeClock())
    with caplog.at_level(logging.INFO, logger="meshroute.serve"):
        async with background_services(gw.config, gw.mesh):
            pass
    opened = [r for r in caplog.records if r.getMessage().startswith("open: ")]
    assert len(opened) == 1 and "mDNS: off" in opened[0].getMessage()


async def test_routing_config_warns_about_insecure_gossip() -> None:
    async def config_of(**settings: Any) -> dict[str, Any]:
        gw = build_gateway(replace(ServeSettings(mdns=False), **settings), clock=FakeClock())
        transport = httpx.ASGITransport(app=gw.app)
        async with httpx.AsyncClient(transport=transport, base_url="http://gw") as c:
            body: dict[str, Any] = (await c.get("/v1/routing")).json()["config"]
            return body

    warned = await config_of(gossip_listen="0.0.0.0:7946", insecure_gossip=True)
    assert "insecure-gossip" in warned["warnings"][0]
    assert "warnings" not in await config_of(gossip_listen="127.0.0.1:7946")
    assert "warnings" not in await config_of(gossip_listen="0.0.0.0:7946",
                                             gossip_secret="s")
