"""Plain backends (issue 25): `meshroute node --url U --model M` without --layers/--shard in
front of a whole-model server announces one hop; `--caps` declares what it serves; a node's
own API key (`[[node_keys]]` at the tracker, `--api-key-env` at the node) reaches that node
only, and never a log, a TXT record, /v1/routing or /v1/nodes.

The processes are real (`meshroute serve`, `meshroute node`) and find each other over mDNS on
loopback inside the test's network namespace (scripts/isolated)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from benchmarks._procs import stop
from meshroute_middleware.core.contracts.txt import encode_node
from node_agent.cli import node_record, node_settings

from ..upstream import FakeChat, ServerThread
from .conftest import LOOPBACK, PATIENCE_S

KEY = "sk-node-A-7f3e9c1d-secret"
IMAGE = [{"role": "user", "content": [
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]}]
HI = [{"role": "user", "content": "hi"}]


def test_without_layers_and_shard_a_node_is_one_whole_hop() -> None:
    s = node_settings({"url": "http://127.0.0.1:8000", "model": "qwen"}, {})
    assert (s.layers, s.start, s.end, s.caps) == (1, 0, 0, None)
    record = node_record(s, "http://127.0.0.1:8000", "vllm", 20.0)
    assert (record.layers, record.start, record.end) == (1, 0, 0)
    assert record.caps == {"tools", "json_schema"}  # nothing declared: the defaults
    with pytest.raises(ValueError, match="--shard"):
        node_settings({"url": "http://h:1", "model": "m", "layers": 4}, {})


def test_caps_and_the_api_key_env() -> None:
    s = node_settings({"url": "http://127.0.0.1:8000", "model": "m", "caps": "vision,tools",
                       "api_key_env": "MY_KEY"}, {"MY_KEY": KEY})
    assert s.caps == {"vision", "tools"} and s.api_key == KEY
    assert KEY not in repr(s)
    props = encode_node(node_record(s, "http://127.0.0.1:8000", "n", 1.0))
    assert props["caps"] == "vision,tools"
    assert all(KEY not in v for v in props.values())  # the key is never in the TXT record
    env = node_settings({"url": "http://h:1", "model": "m"}, {"MESHROUTE_NODE_CAPS": ""})
    assert env.caps is None
    with pytest.raises(ValueError, match="unknown capability"):
        node_settings({"url": "http://h:1", "model": "m", "caps": "vision,x-ray"}, {})
    with pytest.raises(ValueError, match="MY_KEY") as info:
        node_settings({"url": "http://h:1", "model": "m", "api_key_env": "MY_KEY"}, {})
    assert KEY not in str(info.value)


def keyed(chat: FakeChat, key: str) -> Starlette:
    """A whole-model server that, like vLLM started with --api-key, refuses other callers."""
    inner = chat.app()

    async def guarded(request: Request) -> Response:
        if request.headers.get("authorization") != f"Bearer {key}":
            chat.seen.append({"headers": dict(request.headers), "body": {}})
            return JSONResponse({"error": {"message": "bad key", "type": "auth",
                                           "code": "invalid_api_key"}}, status_code=401)
        return await chat.chat(request)

    return Starlette(routes=[Route("/v1/chat/completions", guarded, methods=["POST"]),
                             *[r for r in inner.routes if getattr(r, "path", "") !=
                               "/v1/chat/completions"]])


def _free_port() -> int:
    import socket
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.1)


@pytest.fixture
def processes() -> Iterator[Callable[..., subprocess.Popen[Any]]]:
    started: list[subprocess.Popen[Any]] = []

    def start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[Any]:
        with log.open("ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", "meshroute_middleware.app.cli",
                                     *args], stdout=out, stderr=subprocess.STDOUT,
                                    env={**os.environ, "PYTHONUNBUFFERED": "1", **env})
        started.append(proc)
        return proc

    yield start
    stop(started, wait_s=10)


def test_a_whole_model_node_with_its_own_key(
        tmp_path: Path, processes: Callable[..., subprocess.Popen[Any]]) -> None:
    eyes, plain = FakeChat("eyes", tokens=5), FakeChat("plain", tokens=5)
    with ServerThread(keyed(eyes, KEY)) as a, ServerThread(plain.app()) as b:
        config = tmp_path / "meshroute.toml"
        config.write_text(f'[[node_keys]]\nnode = "vllm-a"\nurl = "{a.url}"\n'
                          'key = "env:NODE_A_KEY"\n')
        port = _free_port()
        url = f"http://{LOOPBACK}:{port}"
        serve_log, node_log = tmp_path / "serve.log", tmp_path / "node.log"
        env = {"NODE_A_KEY": KEY, "XDG_STATE_HOME": str(tmp_path)}
        processes(["serve", "--host", LOOPBACK, "--port", str(port), "--mdns-interfaces",
                   LOOPBACK, "--config", str(config), "--seed", "1"], serve_log, env)
        common = ["--mdns-interfaces", LOOPBACK, "--load-from", "none", "--model", "qwen"]
        processes(["node", "--url", a.url, "--node-id", "vllm-a", "--caps",
                   "vision,tools", "--api-key-env", "NODE_A_KEY", "--tps", "1", *common],
                  node_log, env)
        processes(["node", "--url", b.url, "--node-id", "plain-b", "--tps", "500", *common],
                  node_log, {})

        def nodes() -> dict[str, Any]:
            try:
                got = httpx.get(url + "/v1/nodes", timeout=2).json()["nodes"]
            except (httpx.TransportError, ValueError):
                return {}
            return {n["node_id"]: n for n in got}
        until(lambda: set(nodes()) == {"vllm-a", "plain-b"}, "both nodes are discovered")
        record = nodes()["vllm-a"]
        assert (record["layers"], record["start"], record["end"]) == (1, 0, 0)
        assert record["caps"] == ["vision", "tools"]
        assert nodes()["plain-b"]["caps"] == ["tools", "json_schema"]

        client = openai.OpenAI(base_url=url + "/v1", api_key="client-key", max_retries=0)
        raw = client.chat.completions.with_raw_response.create(model="qwen", messages=IMAGE)
        assert raw.headers["x-meshroute-route"] == "qwen|vllm-a[0-0]"  # one hop
        assert raw.parse().choices[0].message.content
        for _ in range(6):
            client.chat.completions.create(model="qwen", messages=HI)
        # the key reached its node, on every request to it, and no other node
        assert eyes.seen and all(s["headers"].get("authorization") == f"Bearer {KEY}"
                                 for s in eyes.seen)
        assert plain.seen and all(KEY not in str(s["headers"]) for s in plain.seen)
        shown = "".join(httpx.get(url + path, timeout=5).text
                        for path in ("/v1/nodes", "/v1/routing", "/metrics", "/v1/models"))
    assert KEY not in shown
    assert KEY not in serve_log.read_text() and KEY not in node_log.read_text()
