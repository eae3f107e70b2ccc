"""`meshroute node --register` with `meshroute serve --workers 2` (issue 33): a registration
and the DELETE at the node's exit reach one worker each, and are shared with the other through
the state file (app/nodeshare.py), so the whole gateway routes the node, then drops it. The
health checks are set far apart (60 s), so only the shared DELETE can remove the node in
time. The times are printed; the bounds are generous (a loaded 2-core machine)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from meshroute_middleware.app.nodeshare import NodeLog

from ..upstream import free_port

PATIENCE_S = 60.0
SAMPLES = 16  # new connections in a row: the kernel spreads them over both workers


def _node_ids(url: str) -> list[str] | None:
    try:  # a new connection each time
        nodes = httpx.get(f"{url}/v1/nodes", timeout=5).json()["nodes"]
    except (httpx.TransportError, ValueError, KeyError):
        return None
    return sorted(n["node_id"] for n in nodes)


def _every_worker(url: str, expect: list[str]) -> bool:
    return all(_node_ids(url) == expect for _ in range(SAMPLES))


def _until(check: Callable[[], bool], what: str) -> float:
    began = time.monotonic()
    while not check():
        assert time.monotonic() - began < PATIENCE_S, f"never: {what}"
        time.sleep(0.1)
    return time.monotonic() - began


def _start(args: list[str], log: Path, env: dict[str, str]) -> subprocess.Popen[Any]:
    with log.open("ab") as out:
        return subprocess.Popen([sys.executable, "-m", "meshroute_middleware.app.cli", *args],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "PYTHONUNBUFFERED": "1", **env})


def test_register_and_delete_reach_every_worker(tmp_path: Path) -> None:
    port, log = free_port(), tmp_path / "procs.log"
    url = f"http://127.0.0.1:{port}"
    env = {"MESHROUTE_NODE_TOKEN": "s3cret-node-token"}
    serve = _start(["serve", "--port", str(port), "--no-mdns", "--workers", "2",
                    "--health-interval", "60", "--state-file", str(tmp_path / "state.db")],
                   log, env)
    node = None
    try:
        _until(lambda: _node_ids(url) == [], "the gateway answers")
        node = _start(["node", "--emulate", "--host", "127.0.0.1", "--port", "0",
                       "--no-mdns", "--register", url, "--model", "emu", "--node-id", "reg1",
                       "--seconds-per-layer", "0", "--tps", "500"], log, env)
        joined_s = _until(lambda: _every_worker(url, ["reg1"]), "both workers hold the node")
        node.send_signal(signal.SIGINT)
        gone_s = _until(lambda: _every_worker(url, []), "both workers dropped the node")
        assert node.wait(30) == 0
        print(f"held by both workers {joined_s:.2f} s after the node started; dropped by "
              f"both {gone_s:.2f} s after its SIGINT")
        assert gone_s < 30.0  # the health checks (60 s apart) cannot have done it
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
