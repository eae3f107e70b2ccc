"""Issue 22, item 4: the addon as a confused deputy. A proxy client's write to the side server
through the proxy counted as loopback, a node's Set-Cookie reached the client, plain mitmdump
listened on every interface, and every host's chat traffic was taken by model name.

The remote proxy client is a second address on lo (192.0.2.10, TEST-NET-1) inside the private
network namespace of scripts/isolated; those tests are skipped outside one.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mitmproxy")

import httpx

import meshroute_middleware.app.mitm
from tests.upstream import FakeChat, ServerThread, free_port

from .harness import Node, running_mitm

REMOTE = "192.0.2.10"
BASE = "http://mesh.invalid/v1"
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def remote() -> str:
    """A non-loopback source address, on lo of this test's own network namespace."""
    if os.environ.get("MESHROUTE_ISOLATED") != "1":
        pytest.skip("needs scripts/isolated (adds an address to the namespace's lo)")
    done = subprocess.run(["ip", "addr", "replace", f"{REMOTE}/32", "dev", "lo"],
                          capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot add {REMOTE} to lo: {done.stderr.decode().strip()}")
    return REMOTE


def proxied(proxy: str) -> httpx.Client:
    return httpx.Client(proxy=proxy, timeout=20)


def through(proxy: str, source: str, method: str, url: str, body: Any = None,
            headers: dict[str, str] | None = None) -> tuple[int, Any]:
    """One request through the proxy from `source` (httpx binds no source address for a
    proxy): its status and JSON body."""
    host, port = proxy.rsplit("/", 1)[1].split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=20, source_address=(source, 0))
    try:
        payload = None if body is None else json.dumps(body)
        conn.request(method, url, payload, {"content-type": "application/json",
                                            **(headers or {})})
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read() or b"null")
    finally:
        conn.close()


@pytest.fixture
def heads() -> Iterator[tuple[FakeChat, FakeChat]]:
    yield FakeChat("real"), FakeChat("evil")


def test_a_proxy_client_is_judged_by_its_own_address_at_the_side_server(
        tmp_path: Path, remote: str, heads: tuple[FakeChat, FakeChat]) -> None:
    real, evil = heads
    with ServerThread(evil.app()) as evil_head, running_mitm(
            tmp_path, [Node("gpu-a", app=real.app())]) as mitm:
        repoint = {**Node("gpu-a", tps=1e6, url=evil_head.url).record()}
        with httpx.Client(transport=httpx.HTTPTransport(local_address=remote),
                          timeout=20) as direct:
            assert direct.post(mitm.side + "/v1/nodes", json=repoint).status_code == 401
        # before: 200, gpu-a re-pointed (the side server saw mitmproxy's loopback address)
        status, body = through(mitm.proxy, remote, "POST", mitm.side + "/v1/nodes", repoint,
                               {"x-forwarded-for": "127.0.0.1"})
        assert (status, body["error"]["code"]) == (401, "unauthorized")
        assert through(mitm.proxy, remote, "DELETE", mitm.side + "/v1/nodes/gpu-a")[0] == 401
        port = mitm.side.rsplit(":", 1)[1]
        assert through(mitm.proxy, remote, "POST", f"http://localhost:{port}/v1/nodes",
                       repoint)[0] == 401
        # spellings that are no name of this gateway: the Host rule refuses them
        for spelled in (f"http://2130706433:{port}", f"http://0.0.0.0:{port}"):
            assert through(mitm.proxy, remote, "POST", spelled + "/v1/nodes", repoint)[0] == 421
        assert mitm.addon.router is not None
        node = mitm.addon.router.topology.node("gpu-a")
        assert node is not None and node.tps == 10.0 and node.url != evil_head.url
        with proxied(mitm.proxy) as local:  # a proxy client on loopback: trusted, as directly
            moved = local.post(mitm.side + "/v1/nodes",
                               json={**Node("gpu-a", tps=11.0, url=node.url).record()})
        assert moved.status_code == 200


def test_a_browser_page_cannot_write_to_the_side_server(
        tmp_path: Path, heads: tuple[FakeChat, FakeChat]) -> None:
    real, _ = heads
    with running_mitm(tmp_path, [Node("gpu-a", app=real.app())]) as mitm:
        record = Node("gpu-a", tps=1e6, url="http://127.0.0.1:9").record()
        forged = httpx.post(mitm.side + "/v1/nodes", content=json.dumps(record),
                            headers={"content-type": "text/plain",
                                     "origin": "http://127.0.0.1:5555"})
        rebound = httpx.get(mitm.side + "/v1/nodes", headers={"host": "evil.example"})
        assert (forged.status_code, rebound.status_code) == (403, 421)
        assert httpx.get(mitm.side + "/v1/nodes").status_code == 200


def test_a_nodes_set_cookie_never_reaches_the_client(tmp_path: Path) -> None:
    node = FakeChat("n", extra_headers={"set-cookie": "sid=evil; Path=/", "server": "evil/1",
                                        "x-meshroute-plan": "forged", "x-kept": "yes"})
    with running_mitm(tmp_path, [Node("gpu-a", app=node.app())]) as mitm, \
            proxied(mitm.proxy) as client:
        resp = client.post(BASE + "/chat/completions", json=CHAT)
    assert resp.status_code == 200 and resp.headers["x-kept"] == "yes"
    assert "set-cookie" not in resp.headers  # before: the node's cookie was relayed
    assert "x-meshroute-plan" not in resp.headers and "evil" not in resp.headers.get(
        "server", "")
    assert resp.headers["x-meshroute-route"]


def test_the_chat_host_allow_list(tmp_path: Path) -> None:
    mesh, upstream = FakeChat("mesh"), FakeChat("upstream")
    with ServerThread(upstream.app()) as other, running_mitm(
            tmp_path, [Node("gpu-a", app=mesh.app())],
            meshroute_chat_hosts=["mesh.invalid"]) as mitm, proxied(mitm.proxy) as client:
        routed = client.post(BASE + "/chat/completions", json=CHAT)
        passed = client.post(other.url + "/v1/chat/completions", json=CHAT)
    assert routed.status_code == 200 and routed.headers["x-meshroute-route"]
    # a host not on the list keeps its own upstream, even for a model the mesh serves
    assert passed.status_code == 200 and "x-meshroute-route" not in passed.headers
    assert len(mesh.seen) == 1 and len(upstream.seen) == 1


def test_without_the_list_every_hosts_chat_is_taken_by_model_name(tmp_path: Path) -> None:
    mesh, upstream = FakeChat("mesh"), FakeChat("upstream")
    with ServerThread(upstream.app()) as other, running_mitm(
            tmp_path, [Node("gpu-a", app=mesh.app())]) as mitm, proxied(mitm.proxy) as client:
        taken = client.post(other.url + "/v1/chat/completions", json=CHAT)
    assert taken.headers["x-meshroute-route"] and upstream.seen == []  # docs/security.md


ADDON = Path(meshroute_middleware.app.mitm.__file__).parent / "addon.py"


@pytest.mark.parametrize("how", ["mitmdump -s", "meshroute mitm"])
def test_the_proxy_listens_on_loopback_unless_told_otherwise(tmp_path: Path, how: str) -> None:
    nodes = tmp_path / "nodes.json"
    nodes.write_text("[]")
    port = free_port()
    meshroute = ["--set", f"meshroute_nodes_file={nodes}", "--set", "meshroute_side_port=0",
                 "--set", "meshroute_mdns=false"]
    command = ([str(Path(sys.executable).parent / "mitmdump"), "-s", str(ADDON),
                "--listen-port", str(port), *meshroute] if how == "mitmdump -s" else
               [sys.executable, "-m", "meshroute_middleware.app.mitm.cli", "--nodes-file",
                str(nodes), "--side-port", "0", "--no-mdns", "--listen-port", str(port)])
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            seen.append(line)
            if "listening at" in line:
                break
    finally:
        proc.terminate()
        proc.wait(20)
    listening = next((line for line in seen if "listening at" in line), "".join(seen))
    assert f"127.0.0.1:{port}" in listening  # before, plain mitmdump: *:{port}
