"""Issue 11, item 2: who may change the mesh. Each test is an attack that worked before.

Sources (docs/security.md): an HTTP write is trusted when it comes from a loopback client
(no --node-token) or carries the token; an mDNS record is trusted when signed with the mesh
secret, else it is an unsigned claim of its service instance name `mdns:<instance>`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import anyio
import httpx
import pytest

from meshroute_middleware.app.gateway import Gateway, build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.core import NodeRecord, RouterConfig
from meshroute_middleware.forwarding.client import ForwardTimeouts
from meshroute_middleware.forwarding.memory import ASGIForwarder
from node_agent.announcer import _Registered
from node_agent.discovery import MISSES_TO_REMOVE, Discovery, tracker_discovery
from node_agent.mdns import NODE_SERVICE, encode_record, service_info

from ..conftest import FakeClock
from ..node_agent.conftest import LOOPBACK, PATIENCE_S
from ..upstream import FakeChat, ServerThread

pytestmark = pytest.mark.anyio

REAL, EVIL = "http://127.0.0.1:1001", "http://127.0.0.1:6666"
REAL_SERVICE, EVIL_SERVICE = f"gpu-a.{NODE_SERVICE}", f"evil.{NODE_SERVICE}"
SECRET = "mesh-secret"


def record(url: str = REAL, tps: float = 10.0, node_id: str = "gpu-a") -> NodeRecord:
    return NodeRecord(node_id, "m", 0, 39, 40, url, tps)


def gateway(heads: dict[str, FakeChat] | None = None, **settings: Any) -> Gateway:
    base = replace(ServeSettings(mdns=False, seed=1, router=RouterConfig(explore_share=0.0)),
                   **settings)
    apps = {url: head.app() for url, head in (heads or {}).items()}
    return build_gateway(base, forwarder=ASGIForwarder(apps, ForwardTimeouts(first_byte_s=1)),
                         clock=FakeClock())


def client(gw: Gateway, address: str = "127.0.0.1") -> httpx.AsyncClient:
    transport = httpx.ASGITransport(app=gw.app, client=(address, 40000))
    return httpx.AsyncClient(transport=transport, base_url="http://gw")


def rejected(gw: Gateway, source: str) -> int:
    return gw.telemetry.rejected.get(source, 0)


# -- unsigned mDNS records ----------------------------------------------------------------
async def test_unsigned_record_of_another_instance_cannot_steal_a_node_id() -> None:
    real, evil = FakeChat("real", tokens=20), FakeChat("evil", tokens=20)
    gw = gateway({REAL: real, EVIL: evil})
    discovery = Discovery(gw.mesh)
    discovery.announced(REAL_SERVICE, encode_record(record()))
    discovery.announced(EVIL_SERVICE, encode_record(record(EVIL, tps=1e6)))  # the attack
    assert gw.router.topology.node("gpu-a") == replace(record(), seen_at=gw.router.clock())
    assert rejected(gw, "mdns-claim") == 1
    async with client(gw) as c:
        resp = await c.post("/v1/chat/completions", headers={"authorization": "Bearer sk-u"},
                            json={"model": "m", "messages": [{"role": "user", "content": "x"}]})
    assert resp.status_code == 200 and resp.json()["choices"][0]["message"]["content"] == (
        "from real")
    assert evil.seen == []  # the client's bearer never reached the attacker
    discovery.goodbye(EVIL_SERVICE)  # the attacker's goodbye removes nothing of gpu-a
    assert gw.router.topology.node("gpu-a") is not None


async def test_unsigned_record_of_the_same_instance_cannot_repoint_the_url() -> None:
    gw = gateway()
    discovery = Discovery(gw.mesh)
    discovery.announced(REAL_SERVICE, encode_record(record()))
    discovery.announced(REAL_SERVICE, encode_record(record(EVIL)))  # same name, new URL
    node = gw.router.topology.node("gpu-a")
    assert node is not None and node.url == REAL
    discovery.announced(REAL_SERVICE, encode_record(record(tps=25.0)))  # its own refresh
    node = gw.router.topology.node("gpu-a")
    assert node is not None and node.tps == 25.0
    discovery.goodbye(REAL_SERVICE)  # the announcement's own goodbye still works
    assert gw.router.topology.node("gpu-a") is None


async def test_unsigned_record_cannot_take_over_a_node_registered_over_http() -> None:
    gw = gateway()
    async with client(gw) as c:
        resp = await c.post("/v1/nodes", json=record().to_dict())
        assert resp.status_code == 201
    discovery = Discovery(gw.mesh)
    discovery.announced(REAL_SERVICE, encode_record(record(EVIL)))
    node = gw.router.topology.node("gpu-a")
    assert node is not None and node.url == REAL
    discovery.goodbye(REAL_SERVICE)
    assert gw.router.topology.node("gpu-a") is not None
    assert rejected(gw, "mdns-claim") == 1


async def test_node_id_is_held_while_health_checks_still_probe_it() -> None:
    gw = gateway()
    discovery = Discovery(gw.mesh)
    discovery.announced(REAL_SERVICE, encode_record(record()))
    for _ in range(MISSES_TO_REMOVE):  # the real node stops answering for a while
        discovery.apply_probe(record(), ok=False)
    assert gw.router.topology.node("gpu-a") is None and "gpu-a" in discovery.down
    discovery.announced(EVIL_SERVICE, encode_record(record(EVIL)))  # grab the free id?
    assert gw.router.topology.node("gpu-a") is None
    discovery.apply_probe(record(), ok=True)  # the real node answers again
    node = gw.router.topology.node("gpu-a")
    assert node is not None and node.url == REAL
    discovery.goodbye(EVIL_SERVICE)
    assert gw.router.topology.node("gpu-a") is not None


async def test_signed_record_from_another_instance_may_repoint() -> None:
    gw = gateway(mesh_secret=SECRET)
    discovery = Discovery(gw.mesh, mesh_secret=SECRET)
    discovery.announced(REAL_SERVICE, encode_record(record(), SECRET))
    discovery.announced(EVIL_SERVICE, encode_record(record(EVIL)))  # unsigned: ignored
    node = gw.router.topology.node("gpu-a")
    assert node is not None and node.url == REAL
    moved = "http://127.0.0.1:2002"
    discovery.announced(f"gpu-a-new.{NODE_SERVICE}", encode_record(record(moved), SECRET))
    node = gw.router.topology.node("gpu-a")
    assert node is not None and node.url == moved  # a mesh member moved it: allowed
    discovery.goodbye(REAL_SERVICE)  # the old announcement no longer owns it
    assert gw.router.topology.node("gpu-a") is not None
    discovery.goodbye(f"gpu-a-new.{NODE_SERVICE}")
    assert gw.router.topology.node("gpu-a") is None


# -- HTTP node writes ---------------------------------------------------------------------
async def test_node_writes_from_another_address_need_a_token() -> None:
    gw = gateway()
    async with client(gw, "10.55.0.9") as c:
        for resp in (await c.post("/v1/nodes", json=record(EVIL).to_dict()),
                     await c.delete("/v1/nodes/gpu-a")):
            assert resp.status_code == 401
            assert resp.json()["error"]["code"] == "unauthorized"
            assert resp.json()["error"]["type"]
    assert gw.router.topology.size() == 0 and rejected(gw, "http") == 2
    async with client(gw, "::1") as c:  # loopback (v6) may
        assert (await c.post("/v1/nodes", json=record().to_dict())).status_code == 201
    async with client(gw, "10.55.0.9") as c:
        assert (await c.delete("/v1/nodes/gpu-a")).status_code == 401
        assert (await c.get("/v1/nodes")).status_code == 200  # reading stays open
    assert gw.router.topology.node("gpu-a") is not None


async def test_a_token_lets_other_addresses_write_and_binds_loopback_too() -> None:
    gw = gateway(node_token="t0k")
    auth = {"authorization": "Bearer t0k"}
    async with client(gw, "10.55.0.9") as c:
        assert (await c.post("/v1/nodes", json=record().to_dict(), headers=auth)
                ).status_code == 201
    async with client(gw) as c:  # with a token set, loopback needs it too
        resp = await c.delete("/v1/nodes/gpu-a")
        assert resp.status_code == 401 and resp.json()["error"]["code"] == "invalid_token"


@pytest.fixture
def other_address() -> Iterator[str]:
    """A non-loopback address on `lo` inside this suite's own network namespace."""
    if os.environ.get("MESHROUTE_ISOLATED") != "1" or os.geteuid() != 0:
        pytest.skip("needs scripts/isolated as root (an address added to the namespace's lo)")
    address = "10.55.0.1"
    subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)
    try:
        yield address
    finally:
        subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], check=False)


def test_real_socket_from_another_address_gets_401(other_address: str) -> None:
    gw = gateway()
    with ServerThread(gw.app) as server:
        stranger = httpx.HTTPTransport(local_address=other_address)
        with httpx.Client(transport=stranger, base_url=server.url) as c:
            resp = c.post("/v1/nodes", json=record(EVIL).to_dict())
            assert resp.status_code == 401 and resp.json()["error"]["code"] == "unauthorized"
        with httpx.Client(base_url=server.url) as c:  # the same server, from 127.0.0.1
            assert c.post("/v1/nodes", json=record().to_dict()).status_code == 201
    node = gw.router.topology.node("gpu-a")
    assert node is not None and node.url == REAL


async def test_real_multicast_impostor_is_refused_and_its_goodbye_removes_nothing() -> None:
    """The attack over real mDNS on loopback: an impostor instance announcing `gpu-a`."""
    gw = gateway()
    real, impostor, bystander = (_Registered(LOOPBACK), _Registered(LOOPBACK),
                                 _Registered(LOOPBACK))

    def info(ident: str, rec: NodeRecord) -> Any:
        return service_info(NODE_SERVICE, ident, rec.url, encode_record(rec), LOOPBACK)

    async def until(condition: Any) -> None:
        with anyio.fail_after(PATIENCE_S):
            while not condition():
                await anyio.sleep(0.02)

    try:
        async with tracker_discovery(gw.mesh, interfaces=LOOPBACK, health_interval_s=600):
            await real.register(info("gpu-a", record()))
            await until(lambda: gw.router.topology.node("gpu-a") is not None)
            await impostor.register(info("evil", record(EVIL, tps=1e6)))
            await until(lambda: rejected(gw, "mdns-claim") >= 1)
            await impostor.close()  # its goodbye
            await bystander.register(info("gpu-b", record("http://127.0.0.1:1002",
                                                          node_id="gpu-b")))
            await until(lambda: gw.router.topology.node("gpu-b") is not None)  # after it
            node = gw.router.topology.node("gpu-a")
            assert node is not None and node.url == REAL and node.tps == 10.0
    finally:
        for service in (real, impostor, bystander):
            await service.close()
