"""Issue 11, item 3 — where nodes may point: no redirect is followed, node URLs are http(s)
without userinfo, query or fragment, never link-local or cloud metadata, and inside
`--node-networks` when it is set; checked in the core, so every source obeys it."""

from __future__ import annotations

import socket
from typing import Any

import httpx
import pytest

from meshroute_middleware.app.settings import SettingsError, load_settings
from meshroute_middleware.core import InvalidNodeError, NodeRecord, RouterConfig, parse_node
from meshroute_middleware.middleware import build_router

from ..upstream import FakeChat, ServerThread
from .edge_util import EdgeGateway, RawNode

SECRET = "internal-only: the admin password is hunter2"


def record(url: str) -> dict[str, Any]:
    return {"node_id": "n", "model": "m", "start": 0, "end": 39, "layers": 40, "url": url}


@pytest.mark.parametrize("url", [
    "http://user:pass@127.0.0.1:9000",  # userinfo
    "http://@127.0.0.1:9000",
    "http://127.0.0.1:9000/?next=/admin",  # query
    "http://127.0.0.1:9000/#frag",  # fragment
    "ftp://127.0.0.1:9000", "file:///etc/passwd", "gopher://127.0.0.1:70",
    "http://169.254.169.254", "http://169.254.169.254/latest/meta-data",  # cloud metadata
    "http://169.254.1.1:8080",  # link-local
    "http://[fe80::1]:8080", "http://[FE80::abcd%25lo]:80",
    "http://[::ffff:169.254.169.254]",  # IPv4-mapped link-local
    "http://[fd00:ec2::254]",  # AWS IPv6 metadata
    "http://2852039166", "http://0xa9fea9fe", "http://169.254.43518",  # numeric spellings
    "http://0251.0376.0251.0376",  # octal spelling of 169.254.169.254
    "http://metadata.google.internal", "http://metadata.google.internal./computeMetadata",
    "http://127.0.0.1:99999", "http://127.0.0.1:0x50",
])
def test_node_urls_that_are_refused(url: str) -> None:
    with pytest.raises(InvalidNodeError):
        parse_node(record(url))


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:9000", "https://gpu-a.lan:8443/v1-prefix", "http://[::1]:8080",
    "http://node-7", "http://10.0.0.5", "http://192.168.1.20:80/",
])
def test_node_urls_that_are_accepted(url: str) -> None:
    assert parse_node(record(url)).url == url.rstrip("/")


def test_node_networks_restrict_node_hosts_to_ip_literals_inside_them() -> None:
    from meshroute_middleware.core.topology import check_node_url, parse_networks
    nets = parse_networks(["10.0.0.0/8", "fd12::/16"])
    check_node_url("http://10.1.2.3:8000", nets)
    check_node_url("http://[fd12::5]:8000", nets)
    for url in ("http://127.0.0.1:8000", "http://192.168.0.1", "http://node-a.lan:80",
                "http://[fd13::1]"):
        with pytest.raises(InvalidNodeError, match="outside the allowed node networks"):
            parse_node(record(url), networks=nets)
    with pytest.raises(ValueError):
        parse_networks(["10.0.0.0/33"])


def test_topology_refuses_a_record_built_elsewhere_outside_the_networks() -> None:
    """mDNS and static files build NodeRecords too: the topology checks every upsert."""
    from meshroute_middleware.core.topology import Topology, parse_networks
    topo = Topology(parse_networks(["127.0.0.2/32"]))
    with pytest.raises(InvalidNodeError):
        topo.upsert(NodeRecord("n", "m", 0, 39, 40, "http://127.0.0.1:9"), now=1.0)
    with pytest.raises(InvalidNodeError):  # link-local is refused with or without networks
        Topology().upsert(NodeRecord("n", "m", 0, 39, 40, "http://169.254.169.254"), now=1.0)
    assert topo.nodes() == []
    assert topo.upsert(NodeRecord("n", "m", 0, 39, 40, "http://127.0.0.2:9"), now=1.0) == "join"
    router = build_router(RouterConfig(node_networks=("127.0.0.2/32",)))
    with pytest.raises(InvalidNodeError):
        router.upsert_node(NodeRecord("n", "m", 0, 39, 40, "http://127.0.0.1:9"))


def test_node_networks_setting() -> None:
    settings = load_settings({"node_networks": ["10.0.0.0/8,192.168.0.0/16"]})
    assert settings.router.node_networks == ("10.0.0.0/8", "192.168.0.0/16")
    assert load_settings({}).router.node_networks == ()
    with pytest.raises(SettingsError, match="--node-networks"):
        load_settings({"node_networks": ["not-a-network"]})


def test_http_registration_of_a_metadata_url_is_refused_and_counted() -> None:
    with EdgeGateway() as gw:
        for url in ("http://169.254.169.254", "http://u:p@127.0.0.1:1"):
            resp = gw.register("evil", url)
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["code"]
        assert gw.gateway.router.topology.nodes() == []
        assert gw.rejected("http") >= 2


def test_node_networks_refuse_a_node_on_another_address() -> None:
    """The node listens on 127.0.0.2 (another loopback address, inside the test's own
    namespace); only 127.0.0.1/32 is allowed."""
    head = FakeChat("a")
    with ServerThread(head.app()) as up, EdgeGateway(
            router=RouterConfig(explore_share=0.0, node_networks=("127.0.0.1/32",))) as gw:
        with socket.socket() as probe:  # 127.0.0.0/8 is all loopback on Linux
            probe.bind(("127.0.0.2", 0))
            other = f"http://127.0.0.2:{probe.getsockname()[1]}"
        assert gw.register("outside", other).status_code == 400
        assert gw.register("inside", up.url).status_code in (200, 201)
        assert [n.node_id for n in gw.gateway.router.topology.nodes()] == ["inside"]


def test_a_redirect_from_a_node_is_never_followed() -> None:
    """A node answering 302 → an internal URL: the gateway does not fetch it; the attempt is
    a failure ('redirect') and, with no other route, the client gets 502 JSON."""
    internal = FakeChat("internal")

    def redirect(sock: socket.socket, head: bytes) -> None:
        sock.sendall(b"HTTP/1.1 302 Found\r\nlocation: " + target.encode()
                     + b"/v1/chat/completions\r\ncontent-length: 0\r\n\r\n")

    with ServerThread(internal.app()) as inner, RawNode(redirect) as evil, EdgeGateway() as gw:
        target = inner.url
        assert gw.register("evil", evil.url).status_code in (200, 201)
        resp = httpx.post(gw.url + "/v1/chat/completions",
                          json={"model": "m", "messages": [{"role": "user", "content": SECRET}]},
                          timeout=10)
        assert resp.status_code == 502, resp.text  # issue 24: an upstream failure (was 503)
        assert resp.json()["error"]["code"] == "upstream_failed"
        assert "from internal" not in resp.text
        assert internal.seen == []  # nobody fetched the internal URL
        assert len(evil.requests) == 1
        [outcome] = gw.outcomes()
        assert outcome["ok"] is False and outcome["error"] == "redirect"
