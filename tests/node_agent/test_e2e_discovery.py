"""End to end: `meshroute serve` discovers `meshroute node --emulate` processes over mDNS."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import anyio
import pytest

from .conftest import LOOPBACK, PATIENCE_S

pytestmark = pytest.mark.anyio

Start = Callable[..., subprocess.Popen[str]]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind((LOOPBACK, 0))
        return int(probe.getsockname()[1])


def _stop(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(5)


@pytest.fixture
def gateways() -> Iterator[Callable[..., tuple[str, subprocess.Popen[bytes]]]]:
    """Start `meshroute serve` processes on loopback with mDNS bound to 127.0.0.1."""
    started: list[subprocess.Popen[bytes]] = []

    def start(*extra: str) -> tuple[str, subprocess.Popen[bytes]]:
        port = _free_port()
        command = [sys.executable, "-m", "meshroute_middleware.app.cli", "serve", "--host",
                   LOOPBACK, "--port", str(port), "--mdns-interfaces", LOOPBACK,
                   "--health-interval", "0.5", *extra]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "MESHROUTE_GOSSIP_SECRET": "e2e"}
        started.append(subprocess.Popen(command, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL, env=env))
        return f"http://{LOOPBACK}:{port}", started[-1]

    yield start
    for process in started:
        _stop(process)


@pytest.fixture
def gateway(gateways: Callable[..., tuple[str, subprocess.Popen[bytes]]]) -> str:
    return gateways()[0]


async def _signatures(session: aiohttp.ClientSession, url: str) -> list[str]:
    try:
        async with session.get(url + "/v1/routing") as resp:
            table: dict[str, Any] = await resp.json()
    except (aiohttp.ClientError, OSError):
        return []
    return [row["signature"] for model in table["models"].values()
            for row in model["candidates"]]


async def _until_signatures(session: aiohttp.ClientSession, url: str,
                            condition: Callable[[list[str]], bool], timeout_s: float
                            ) -> list[str]:
    with anyio.fail_after(timeout_s):
        while not condition(signatures := await _signatures(session, url)):
            await anyio.sleep(0.05)
    return signatures


async def test_gateway_routes_through_discovered_nodes(gateway: str,
                                                       node_processes: Start) -> None:
    node_processes("e2e-head", "--shard", "0-15", "--seconds-per-layer", "0.0002")
    tail = node_processes("e2e-tail", "--shard", "16-31", "--seconds-per-layer", "0.0002")
    route = "emu-model|e2e-head[0-15]->e2e-tail[16-31]"
    async with aiohttp.ClientSession() as session:
        await _until_signatures(session, gateway, lambda s: route in s, PATIENCE_S)
        body = {"model": "emu-model", "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 12}
        async with session.post(gateway + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200, await resp.text()
            assert resp.headers.getall("x-meshroute-route") == [route]
            answer = json.loads(await resp.read())
        assert answer["usage"]["completion_tokens"] == 12
        async with session.get(_node_url(tail) + "/internal/status") as resp:
            assert (await resp.json())["tokens_total"] == 12  # the tail really ran its span

        tail.send_signal(signal.SIGTERM)
        await _until_signatures(session, gateway, lambda s: not any("e2e-tail" in x for x in s),
                                PATIENCE_S)
        assert tail.wait(5) == 0
        async with session.post(gateway + "/v1/chat/completions", json=body) as resp:
            assert resp.status >= 400  # no complete route without the tail
            assert "error" in await resp.json()


def _node_url(process: subprocess.Popen[str]) -> str:
    """The URL a node process printed in its 'announced' line."""
    assert process.stdout is not None
    for line in process.stdout:
        if " announced " in line:
            return line.split(" at ")[1].split()[0]
    raise AssertionError("node process never announced")


async def _gossip_peers(session: aiohttp.ClientSession, url: str) -> float | None:
    try:
        async with session.get(url + "/metrics") as resp:
            text = await resp.text()
    except (aiohttp.ClientError, OSError):
        return None
    for line in text.splitlines():
        if line.startswith("meshroute_gossip_peers "):
            return float(line.split()[1])
    return None


async def test_gateways_find_each_other_as_gossip_peers(
        gateways: Callable[..., tuple[str, subprocess.Popen[bytes]]]) -> None:
    a_url, _ = gateways("--gossip-listen", f"{LOOPBACK}:{_free_port()}")
    b_url, b = gateways("--gossip-listen", f"{LOOPBACK}:{_free_port()}")
    async with aiohttp.ClientSession() as session:
        with anyio.fail_after(PATIENCE_S):  # no --gossip-peer given: mDNS is the only way
            while not (await _gossip_peers(session, a_url) == 1.0
                       and await _gossip_peers(session, b_url) == 1.0):
                await anyio.sleep(0.1)
        _stop(b)  # SIGTERM: b's tracker service says goodbye
        with anyio.fail_after(PATIENCE_S):
            while await _gossip_peers(session, a_url) != 0.0:
                await anyio.sleep(0.1)
