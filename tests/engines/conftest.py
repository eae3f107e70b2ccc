"""A real mesh for the engine tests: two llama-servers, a `meshroute node` agent in front of
each, and one `meshroute serve` that finds the agents over mDNS on loopback."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from benchmarks._procs import stop

from ..upstream import free_port
from .llama_server import LlamaServer, require_engine

LOOPBACK = "127.0.0.1"
MODEL = "smollm2"
# Every mesh's agents announce on the one loopback mDNS domain: each mesh serves a model name
# and node ids of its own, so that one mesh's gateway neither routes to another's servers nor
# drops its nodes when another's agents say goodbye.
_MESHES = itertools.count(1)
PATIENCE_S = 60.0  # discovery and the agents' first reads, on a loaded 2-core machine


def until(condition: Callable[[], bool], what: str, patience_s: float = PATIENCE_S) -> None:
    deadline = time.monotonic() + patience_s
    while not condition():
        assert time.monotonic() < deadline, f"never: {what}"
        time.sleep(0.2)


def meshroute(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "meshroute_middleware.app.cli", *args],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1",
                                     "XDG_STATE_HOME": str(log.parent)})


@dataclass
class Mesh:
    """The running mesh: servers by node id, the gateway's URL, and its processes."""

    workdir: Path
    servers: dict[str, LlamaServer]
    model: str = MODEL
    gateway: str = ""
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    agents: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def nodes(self) -> dict[str, Any]:
        try:
            got = httpx.get(self.gateway + "/v1/nodes", timeout=5).json()["nodes"]
        except (httpx.TransportError, ValueError, KeyError):
            return {}
        return {n["node_id"]: n for n in got}

    def start_agent(self, node_id: str) -> None:
        server = self.servers[node_id]
        self.agents[node_id] = meshroute(
            ["node", "--url", server.url, "--model", self.model, "--node-id", node_id,
             "--mdns-interfaces", LOOPBACK, "--load-from", "llamacpp"],
            self.workdir / f"agent-{node_id}.log")

    def close(self) -> None:
        stop([*self.agents.values(), *self.procs], wait_s=10)
        for server in self.servers.values():
            server.stop()


def start_mesh(workdir: Path, names: tuple[str, ...] = ("a", "b"),
               serve_args: tuple[str, ...] = ()) -> Mesh:
    """Servers `llama-<name>-<n>` of the model `smollm2-<n>`, n this mesh's number."""
    require_engine()
    number = f"{os.getpid()}x{next(_MESHES)}"  # unique across test processes too
    node_ids = tuple(f"llama-{name}-{number}" for name in names)
    mesh = Mesh(workdir, {}, model=f"{MODEL}-{number}")
    try:
        for node_id in node_ids:
            mesh.servers[node_id] = LlamaServer(workdir / f"{node_id}.log").start()
        port = free_port()
        mesh.gateway = f"http://{LOOPBACK}:{port}"
        mesh.procs.append(meshroute(["serve", "--host", LOOPBACK, "--port", str(port),
                                     "--mdns-interfaces", LOOPBACK, "--seed", "1",
                                     *serve_args], workdir / "serve.log"))
        for node_id in node_ids:
            mesh.start_agent(node_id)
        until(lambda: set(node_ids) <= set(mesh.nodes()), "the agents are discovered")
        # an agent announces at once, then again after its first read of the server
        until(lambda: all(mesh.nodes()[n].get("slots") for n in node_ids),
              "the agents announce what their servers said")
    except BaseException:
        mesh.close()
        raise
    return mesh


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mesh]:
    running = start_mesh(tmp_path_factory.mktemp("mesh"))
    try:
        yield running
    finally:
        running.close()
