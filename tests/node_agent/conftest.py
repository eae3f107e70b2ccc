"""Helpers for discovery tests: a recording topology sink and `meshroute node` processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import anyio
import pytest

from meshroute_middleware.core import NodeRecord

LOOPBACK = "127.0.0.1"  # zeroconf on loopback: its default interfaces multicast off the machine


# How long a test waits for something that must happen (discovery, a goodbye, a route): a
# bound that a loaded 2-core machine keeps, a process's start included (15-35 s at load
# 20-33, docs/benchmarks/suite.md; 30 s was missed: tests/upstream.py's SERVE_PATIENCE_S).
# How fast it happens is measured by benchmarks/bench_discovery.py (docs/benchmarks.md), not
# asserted here.
PATIENCE_S = 90.0


class RecordingSink:
    """A TopologySink that keeps records and logs every call with its time."""

    def __init__(self) -> None:
        self.records: dict[str, NodeRecord] = {}
        self.rejections: list[tuple[str, str]] = []
        self.kinds: list[str] = []  # the reason label of each rejection
        self.log: list[tuple[float, str, str]] = []

    def upsert(self, record: NodeRecord, claim: str | None = None) -> str:
        outcome = "refresh" if record.node_id in self.records else "join"
        self.records[record.node_id] = record
        self.log.append((time.monotonic(), "upsert", record.node_id))
        return outcome

    def remove(self, node_id: str, claim: str | None = None) -> bool:
        self.log.append((time.monotonic(), "remove", node_id))
        return self.records.pop(node_id, None) is not None

    def nodes(self) -> list[NodeRecord]:
        return list(self.records.values())

    def reject(self, source: str, reason: str, kind: str = "") -> None:
        self.rejections.append((source, reason))
        self.kinds.append(kind)

    async def wait_for(self, condition: Callable[[], bool], timeout_s: float) -> float:
        """Seconds until `condition()` holds; TimeoutError after timeout_s."""
        began = time.monotonic()
        with anyio.fail_after(timeout_s):
            while not condition():
                await anyio.sleep(0.01)
        return time.monotonic() - began


@pytest.fixture
def sink() -> RecordingSink:
    return RecordingSink()


def start_node(node_id: str, *extra: str) -> subprocess.Popen[str]:
    """`meshroute node --emulate` on loopback as a child process."""
    command = [sys.executable, "-m", "meshroute_middleware.app.cli", "node", "--emulate",
               "--host", LOOPBACK, "--port", "0", "--mdns-interfaces", LOOPBACK,
               "--node-id", node_id, *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)


@pytest.fixture
def node_processes() -> Iterator[Callable[..., subprocess.Popen[str]]]:
    """Start node processes; any still running at the end are killed."""
    started: list[subprocess.Popen[str]] = []

    def start(node_id: str, *extra: str) -> subprocess.Popen[str]:
        process = start_node(node_id, *extra)
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(5)
        if process.stdout is not None:
            process.stdout.close()
