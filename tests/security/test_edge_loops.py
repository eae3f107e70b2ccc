"""Issue 22, item 6 — a node URL pointing at the gateway itself is a forwarding loop: one
request filled --max-connections and /healthz answered 503 for seconds; the node's health
probe to the gateway's own /v1/models passed, so it never left. Such a URL is refused at
registration (POST /v1/nodes, mDNS, --nodes-file: mesh.py), and a request that comes back
through the gateway (its own `via` entry) is refused with 508."""

from __future__ import annotations

import ipaddress
import json
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from meshroute_middleware.app.config import loop_marker
from meshroute_middleware.app.gateway import build_gateway
from meshroute_middleware.app.settings import ServeSettings
from meshroute_middleware.chat.headers import via_entry
from meshroute_middleware.core import NodeRecord
from meshroute_middleware.mesh import Listening
from node_agent.discovery import Discovery
from node_agent.mdns import encode_record

from ..upstream import FakeChat, ServerThread
from .edge_util import EdgeGateway

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def node(url: str, node_id: str = "self", model: str = "m") -> dict[str, object]:
    return {"node_id": node_id, "model": model, "start": 0, "end": 39, "layers": 40,
            "url": url, "tps": 10}


def loop_rejections(gw: EdgeGateway) -> int:
    return sum(n for (source, kind), n in gw.gateway.telemetry.rejected_by.items()
               if kind == "loop")


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::ffff:127.0.0.1]",
                                  "LOCALHOST."])
def test_post_v1_nodes_refuses_the_gateways_own_address(host: str) -> None:
    with EdgeGateway() as gw:
        answer = httpx.post(f"{gw.url}/v1/nodes", json=node(f"http://{host}:{gw.port}/x"))
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["type"] == "invalid_request_error"
        assert "loop" in answer.json()["error"]["message"]
        assert loop_rejections(gw) == 1
        assert httpx.get(f"{gw.url}/v1/nodes").json()["nodes"] == []
        # the same host on another port is somebody else
        other = httpx.post(f"{gw.url}/v1/nodes", json=node(f"http://{host}:{gw.port + 1}"))
        assert other.status_code in (200, 201), other.text


def test_an_mdns_record_of_the_gateways_own_address_is_refused() -> None:
    with EdgeGateway() as gw:
        discovery = Discovery(gw.gateway.mesh)
        record = NodeRecord("mdns-self", "m", 0, 39, 40, f"http://127.0.0.1:{gw.port}")
        discovery.announced("mdns-self._meshroute._tcp.local.", encode_record(record))
        assert gw.gateway.mesh.nodes() == []
        assert gw.gateway.telemetry.rejected_by.get(("mdns", "loop")) == 1


def test_a_nodes_file_naming_the_gateway_itself_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps([node("http://127.0.0.1:18123")]))
    with pytest.raises(ValueError, match="loop"):
        build_gateway(ServeSettings(mdns=False, port=18123, nodes_file=str(path)))
    path.write_text(json.dumps([node("http://127.0.0.1:18124")]))  # another port: fine
    assert len(build_gateway(ServeSettings(mdns=False, port=18123, nodes_file=str(path))
                             ).mesh.nodes()) == 1


def test_listening_on_all_addresses_covers_every_address_of_the_machine() -> None:
    machine = ["127.0.0.1", "::1", "192.0.2.7", "fd00::7"]
    on_all = Listening.on("0.0.0.0", 8080, machine=machine)
    assert on_all is not None
    for url in ("http://192.0.2.7:8080", "http://[fd00::7]:8080/v1", "http://127.0.0.5:8080",
                "http://0.0.0.0:8080", "http://localhost:8080", "http://[::1]:8080"):
        assert on_all.holds(url), url
    for url in ("http://192.0.2.8:8080", "http://192.0.2.7:8081", "http://node.lan:8080"):
        assert not on_all.holds(url), url
    one = Listening.on("127.0.0.1", 8080, machine=machine)
    assert one is not None and one.holds("http://127.0.0.1:8080")
    assert not one.holds("http://192.0.2.7:8080")  # not listening there
    assert Listening.on("127.0.0.1", 0) is None  # an ephemeral port: not known yet
    assert ipaddress.ip_address("0.0.0.0") in on_all.addresses


def test_a_request_carrying_the_gateways_own_via_entry_gets_508() -> None:
    with EdgeGateway() as gw:
        entry = via_entry(loop_marker(gw.gateway.config.tracker_id)).decode()
        answer = httpx.post(f"{gw.url}/v1/chat/completions", json=BODY,
                            headers={"via": f"1.1 someone-else, {entry}"})
        assert answer.status_code == 508
        error = answer.json()["error"]
        assert error["code"] == "loop_detected" and error["message"] and error["type"]
        # another gateway's entry is no loop of ours
        assert httpx.post(f"{gw.url}/v1/chat/completions", json=BODY,
                          headers={"via": "1.1 meshroute-0123456789abcdef"}
                          ).status_code == 404  # no node serves m: routed, not refused


def test_a_loop_through_a_relaying_node_ends_at_the_second_pass() -> None:
    """The node URL is a relay that sends the request back to the gateway (what a DNS name
    or a proxy in between does): the gateway refuses the second pass with 508 at once, so the
    first ends with an error instead of the loop filling every connection."""
    passes: list[str] = []
    target: dict[str, str] = {}

    async def relay(request: Request) -> Response:
        passes.append(request.headers.get("via", ""))
        headers = {k: v for k, v in request.headers.items()
                   if k in ("content-type", "via", "x-meshroute-plan", "x-meshroute-route")}
        async with httpx.AsyncClient() as client:
            back = await client.post(target["url"] + "/v1/chat/completions",
                                     content=await request.body(), headers=headers)
        return Response(back.content, back.status_code,
                        media_type=back.headers.get("content-type"))

    async def models(request: Request) -> Response:
        return Response('{"object": "list", "data": []}', media_type="application/json")

    app = Starlette(routes=[Route("/v1/chat/completions", relay, methods=["POST"]),
                            Route("/v1/models", models)])
    with ServerThread(app) as up, EdgeGateway() as gw:
        target["url"] = gw.url
        assert gw.register("relay", up.url).status_code in (200, 201)
        answer = httpx.post(f"{gw.url}/v1/chat/completions", json=BODY, timeout=30)
        assert answer.status_code >= 500 and "error" in answer.json()
        assert len(passes) == 1  # the request came back once and was refused there
        assert "meshroute-" in passes[0]
        assert gw.gateway.telemetry.rejected.get("http", 0) >= 1
        assert httpx.get(f"{gw.url}/healthz").status_code == 200
        # an ordinary node still serves
        good = FakeChat("g")
        with ServerThread(good.app()) as honest:
            httpx.delete(f"{gw.url}/v1/nodes/relay")
            gw.register("honest", honest.url)
            assert httpx.post(f"{gw.url}/v1/chat/completions", json=BODY).status_code == 200
