"""`meshroute node --register` with `meshroute serve --workers 2` (issue 33): a registration
and the DELETE at the node's exit reach one worker each, and are shared with the other through
the state file (app/nodeshare.py), so the whole gateway routes the node, then drops it. The
health checks are set far apart (60 s), so only the shared DELETE can remove the node in
time.

The issue's bounds are measured worker by worker on `/v1/routing` (what routing shows): every
worker routes the node within 2 s of its registration (the agent's "registered" line), and
none shows it 2 s after the agent's SIGINT, its own stop included. Each probe is a new
connection (the kernel picks the worker) asking /healthz (which worker) and /v1/routing on
it; a worker's first probe after the change is no earlier than the change, so the bound holds
for the worker if it holds for the probe. A wall-clock bound: `alone`."""

from __future__ import annotations

import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pytest

from meshroute_middleware.app.nodeshare import NodeLog

from ..upstream import free_port

PATIENCE_S = 60.0  # for the processes to start on a loaded machine
BOUND_S = 2.0  # issue 33: routable within 2 s, gone within 2 s of SIGINT
WORKERS = 2


def _probe(port: int) -> tuple[str, list[str]] | None:
    """(the answering worker's tracker id, the models its /v1/routing shows), on one new
    connection; None while the gateway does not answer."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        tracker = json.loads(conn.getresponse().read())["tracker"]
        conn.request("GET", "/v1/routing")
        return tracker, sorted(json.loads(conn.getresponse().read())["models"])
    except (OSError, ValueError, KeyError, http.client.HTTPException):
        return None
    finally:
        conn.close()


def _every_worker(port: int, shows: Callable[[list[str]], bool]) -> dict[str, float]:
    """Each worker's first probe (monotonic time) showing what `shows` accepts, from now on
    (a worker counts once it answered so; it does not go back: checked after)."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + PATIENCE_S
    while len(seen) < WORKERS:
        assert time.monotonic() < deadline, f"never seen on every worker: {seen}"
        answer = _probe(port)
        if answer is not None and shows(answer[1]):
            seen.setdefault(answer[0], time.monotonic())
    return seen


def _start(args: list[str], out: IO[bytes] | int, env: dict[str, str]) -> subprocess.Popen[Any]:
    return subprocess.Popen([sys.executable, "-m", "meshroute_middleware.app.cli", *args],
                            stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONUNBUFFERED": "1", **env})


class Lines(threading.Thread):
    """A process's output, each line with the time it was read."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        super().__init__(daemon=True)
        self.proc, self.lines = proc, list[tuple[float, str]]()

    def run(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.lines.append((time.monotonic(), raw.decode(errors="replace").rstrip()))

    def at(self, text: str) -> float:
        deadline = time.monotonic() + PATIENCE_S
        while True:
            for at, line in list(self.lines):
                if text in line:
                    return at
            assert time.monotonic() < deadline and self.proc.poll() is None, self.lines
            time.sleep(0.01)


@pytest.mark.alone
def test_register_and_delete_reach_every_worker_within_2_s(tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "serve.log"
    env = {"MESHROUTE_NODE_TOKEN": "s3cret-node-token"}
    with log.open("ab") as out:
        serve = _start(["serve", "--port", str(port), "--no-mdns", "--workers", str(WORKERS),
                        "--health-interval", "60", "--state-file", str(tmp_path / "state.db")],
                       out, env)
    node = None
    try:
        _every_worker(port, lambda models: models == [])
        node = _start(["node", "--emulate", "--host", "127.0.0.1", "--port", "0",
                       "--no-mdns", "--register", f"http://127.0.0.1:{port}", "--model", "emu",
                       "--node-id", "reg1", "--seconds-per-layer", "0", "--tps", "500"],
                      subprocess.PIPE, env)
        lines = Lines(node)
        lines.start()
        joined = _every_worker(port, lambda models: models == ["emu"])
        registered = lines.at("registered reg1")
        joined_s = max(joined.values()) - registered
        stop = time.monotonic()
        node.send_signal(signal.SIGINT)
        gone = _every_worker(port, lambda models: models == [])
        gone_s = max(gone.values()) - stop
        assert node.wait(30) == 0
        print(f"routed by every worker {joined_s:.2f} s after the node registered; dropped "
              f"by every worker {gone_s:.2f} s after its SIGINT")
        assert joined_s < BOUND_S, (joined, registered)
        assert gone_s < BOUND_S, (gone, stop)
        after = [_probe(port) for _ in range(10)]  # none shows it again
        assert all(a is not None and a[1] == [] for a in after), after
    finally:
        for proc in (node, serve):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(60)
    assert "Traceback" not in log.read_text(), log.read_text()


def test_a_worker_reads_only_its_siblings_writes_after_it_opened(tmp_path: Path) -> None:
    path = str(tmp_path / "state.db")
    first = NodeLog(path, "w0").open()
    first.append("early", '{"node_id": "early"}')
    second = NodeLog(path, "w1").open()  # opened after it: starts past "early"
    first.append("n1", '{"node_id": "n1"}')
    second.append("n2", None)
    first.append("n1", None)
    assert [(w.node_id, w.record) for w in second.others()] == [
        ("n1", '{"node_id": "n1"}'), ("n1", None)]
    assert second.others() == []
    assert [(w.node_id, w.record) for w in first.others()] == [("n2", None)]
