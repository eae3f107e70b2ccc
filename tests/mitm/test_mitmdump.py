"""`mitmdump -s <addon file> --set meshroute_…` as a real process on loopback."""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mitmproxy")

import httpx
import openai

import meshroute_middleware.app.mitm
from node_agent.emulator import EmulatedNode, EmulatorConfig
from tests.upstream import ServerThread, free_port

ADDON = Path(meshroute_middleware.app.mitm.__file__).parent / "addon.py"
MITMDUMP = str(Path(sys.executable).parent / "mitmdump")
STARTUP_TIMEOUT_S = 60.0  # a loaded 2-core machine imports mitmproxy slowly


def mitmdump(*args: str) -> subprocess.Popen[str]:
    return subprocess.Popen([MITMDUMP, "-s", str(ADDON), "--listen-host", "127.0.0.1", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def lines_of(process: subprocess.Popen[str]) -> queue.Queue[str]:
    """The process's output lines as they come ('' at its end)."""
    out: queue.Queue[str] = queue.Queue()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            out.put(line)
        out.put("")

    threading.Thread(target=pump, daemon=True).start()
    return out


def wait_for(lines: queue.Queue[str], needle: str, seen: list[str]) -> None:
    while True:
        line = lines.get(timeout=STARTUP_TIMEOUT_S)
        seen.append(line)
        if needle in line:
            return
        assert line, f"mitmdump ended before {needle!r}:\n{''.join(seen)}"


@pytest.fixture
def node() -> Iterator[str]:
    config = EmulatorConfig(node_id="solo", model="m", start=0, end=39, layers=40, tps=300)
    with ServerThread(EmulatedNode(config).app()) as server:
        yield server.url


def launch(how: str, proxy_port: int, side_port: int, nodes: Path) -> subprocess.Popen[str]:
    if how == "mitmdump -s":
        return mitmdump("--listen-port", str(proxy_port),
                        "--set", f"meshroute_nodes_file={nodes}",
                        "--set", f"meshroute_side_port={side_port}",
                        "--set", "meshroute_mdns=false", "--set", "meshroute_policy=adr0021")
    # what `meshroute mitm` will run: meshroute flags, then mitmdump's own
    return subprocess.Popen([sys.executable, "-m", "meshroute_middleware.app.mitm.cli",
                             "--nodes-file", str(nodes), "--side-port", str(side_port),
                             "--no-mdns", "--policy", "adr0021",
                             "--listen-port", str(proxy_port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.parametrize("how", ["mitmdump -s", "mitm.cli"])
def test_mitmdump_loads_the_addon_and_routes(tmp_path: Path, node: str, how: str) -> None:
    nodes = tmp_path / "nodes.json"
    nodes.write_text(json.dumps({"nodes": [{"node_id": "solo", "model": "m", "start": 0,
                                            "end": 39, "layers": 40, "url": node, "tps": 30}]}))
    proxy_port, side_port = free_port(), free_port()
    process = launch(how, proxy_port, side_port, nodes)
    seen: list[str] = []
    try:
        wait_for(lines_of(process), "/v1/routing and /dashboard on", seen)
        chat = openai.OpenAI(base_url="http://mesh.invalid/v1", api_key="unused", max_retries=0,
                             http_client=httpx.Client(proxy=f"http://127.0.0.1:{proxy_port}",
                                                      timeout=20))
        stream = chat.chat.completions.create(model="m", stream=True, messages=[
            {"role": "user", "content": "hi"}],
                                              max_tokens=9)
        assert len([c for c in stream if c.choices and c.choices[0].delta.content]) == 9
        doc = httpx.get(f"http://127.0.0.1:{side_port}/v1/routing", timeout=5).json()
        assert doc["config"]["policy"] == "adr0021"
        [row] = doc["models"]["m"]["candidates"]
        assert row["signature"] == "m|solo[0-39]" and row["samples"] == 1 and row["tps"] > 0
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)
    assert process.returncode == 0, "".join(seen)


def test_mitmdump_refuses_a_bad_nodes_file(tmp_path: Path) -> None:
    bad = tmp_path / "nodes.json"
    bad.write_text(json.dumps([{"node_id": "x", "model": "m", "start": 5, "end": 2,
                                "layers": 40, "url": "http://127.0.0.1:1"}]))
    process = mitmdump("--listen-port", str(free_port()), "--set",
                       f"meshroute_nodes_file={bad}", "--set", "meshroute_mdns=false")
    output, _ = process.communicate(timeout=STARTUP_TIMEOUT_S)
    assert process.returncode != 0
    assert "node #0" in output
