"""The tracker's state file under faults, with real `meshroute serve` processes: SIGKILL and
restart under load, a read-only file or directory at start, a disk that fills up (a real ENOSPC:
a small tmpfs mounted in a mount namespace of the tracker's own) while serving."""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from meshroute_middleware.state.store import StateStore

from ..upstream import FakeChat, ServerThread, free_port

ROOT = Path(__file__).resolve().parents[2]
HALF_LIFE_S = 60.0
WAIT_S = 60.0  # bound on waiting for a tracker to start, save or count (a loaded 2-core box)


def _serve_cmd(port: int, nodes: Path, state: Path) -> list[str]:
    return [sys.executable, "-m", "meshroute_middleware.app.cli", "serve", "--port", str(port),
            "--no-mdns", "--nodes-file", str(nodes), "--state-file", str(state), "--seed", "1",
            "--route-stats-half-life", str(HALF_LIFE_S), "--log-level", "warning"]


@contextmanager
def tracker(cmd: list[str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(cmd, cwd=ROOT, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
                break
            except httpx.TransportError:
                if proc.poll() is not None:
                    err = proc.stderr.read().decode() if proc.stderr else ""
                    raise AssertionError(f"tracker exited: {err}") from None
                assert time.monotonic() < deadline, "tracker did not start"
                time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


def _nodes(tmp: Path, url: str) -> Path:
    path = tmp / "nodes.json"
    path.write_text(json.dumps([{"node_id": "n", "model": "m", "start": 0, "end": 9,
                                 "layers": 10, "url": url, "tps": 10.0}]))
    return path


def _row(port: int) -> dict[str, Any]:
    table = httpx.get(f"http://127.0.0.1:{port}/v1/routing", timeout=10).json()
    return dict(table["models"]["m"]["candidates"][0])


def _chat(port: int) -> int:
    return httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions",
                      json={"model": "m", "messages": []}, timeout=20).status_code


def _load(port: int, n: int) -> None:
    for _ in range(n):
        assert _chat(port) == 200


def _metric(port: int, name: str, missing: float | None = None) -> float:
    """A metric's value; `missing` when it is not exported (yet), else that fails."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    found = re.search(rf"^{name} (\S+)$", text, re.M)
    if found is None and missing is not None:
        return missing
    assert found, f"{name} not in /metrics"
    return float(found.group(1))


def _until(check: Callable[[], bool], what: str) -> None:
    """Poll `check` (a tracker's counters change on its own schedule) up to WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _samples_reach(port: int, n: int) -> None:
    """Wait until /v1/routing (computed at most once a second) counts `n` samples."""
    _until(lambda: _row(port)["samples"] >= n, f"{n} samples in /v1/routing")
    assert _row(port)["samples"] == n


def _saved_since_now(port: int) -> None:
    """Wait until the state file holds everything the tracker learned before this call."""
    now = time.time()
    # exported once the first save is done
    _until(lambda: _metric(port, "meshroute_state_current_timestamp_seconds", -1.0) >= now,
           "a save")


class _Load(threading.Thread):
    """Chat requests one after another until stopped (bounded); counts the answered ones."""

    def __init__(self, port: int, most: int = 2000) -> None:
        super().__init__(daemon=True)
        self.port, self.most, self.ok = port, most, 0
        self.stop = threading.Event()

    def run(self) -> None:
        for _ in range(self.most):
            if self.stop.is_set():
                return
            try:
                if _chat(self.port) == 200:
                    self.ok += 1
            except httpx.HTTPError:
                return  # the tracker is gone


def test_a_tracker_killed_under_load_comes_back_with_its_statistics_decayed(
        tmp_path: Path) -> None:
    head = FakeChat("n", tokens=20, token_delay_s=0.001)
    with ServerThread(head.app()) as up:
        port, state = free_port(), tmp_path / "state.db"
        cmd = _serve_cmd(port, _nodes(tmp_path, up.url), state)
        with tracker(cmd, port) as proc:
            _load(port, 20)
            _saved_since_now(port)
            before = _row(port)
            assert before["samples"] == 20
            load = _Load(port)
            load.start()
            _until(lambda: load.ok >= 10, "requests under load")
            os.kill(proc.pid, signal.SIGKILL)  # under load, mostly in the middle of a save
            killed_at = time.time()
            load.join(30)
            assert not load.is_alive()
        with sqlite3.connect(state) as db:
            assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        with tracker(cmd, port):
            read_at = time.time()
            after = _row(port)
            # what was learned came back: everything up to the last save before the kill
            # (one save every 0.25 s; the answers of the last moments may be lost)
            assert 20 <= after["samples"] <= 20 + load.ok
            assert after["status"] == "proven"  # same nodes: not stale
            assert 0.5 * before["tps"] <= after["tps"] <= 2 * before["tps"]
            # decayed for the time it was down: never more mass than it ever had, decayed
            # from the kill (the last possible update) to this read
            most = (before["weight"] + load.ok) * 0.5 ** ((read_at - killed_at) / HALF_LIFE_S)
            assert after["weight"] <= most * (1 + 1e-9)
            _load(port, 5)  # and it routes on, learning from where it was
            _samples_reach(port, after["samples"] + 5)
            print(f"\nkilled after {20 + load.ok} answers; back with {after['samples']} "
                  f"samples, weight {before['weight']:.2f} -> {after['weight']:.2f} after "
                  f"{read_at - killed_at:.1f} s down")


def _mount_ns() -> list[str]:
    """The command prefix for a mount namespace of one's own (root: -m; else a user ns too)."""
    for flags in ("-m", "-rm"):
        try:
            if subprocess.run(["unshare", flags, "true"], capture_output=True).returncode == 0:
                return ["unshare", flags]
        except FileNotFoundError:
            break
    pytest.skip("needs unshare -m (or -rm) for a mount namespace")


def _in_mount_ns(setup: str, cmd: list[str]) -> list[str]:
    """`cmd` run in a new mount namespace after the shell commands `setup`."""
    return [*_mount_ns(), "sh", "-c", f"{setup} && exec \"$@\"", "sh", *cmd]


@pytest.mark.parametrize("case", ["read-only directory", "read-only file"])
def test_a_read_only_state_file_is_a_clear_error_at_start(tmp_path: Path, case: str) -> None:
    state_dir = tmp_path / "ro"
    state_dir.mkdir()
    state = state_dir / "state.db"
    if case == "read-only file":  # a state file of an earlier run, on a read-only mount
        StateStore(state).open().close()
        setup = f"mount --bind {state_dir} {state_dir} && mount -o remount,ro,bind {state_dir}"
    else:  # nothing there yet, and nothing can be created
        setup = f"mount -t tmpfs -o size=1m,ro tmpfs {state_dir}"
    cmd = _serve_cmd(free_port(), _nodes(tmp_path, "http://127.0.0.1:9"), state)
    done = subprocess.run(_in_mount_ns(setup, cmd), cwd=ROOT, capture_output=True, timeout=120)
    err = done.stderr.decode()
    assert done.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"meshroute serve: cannot open state file {state}: "), err
    assert "read-only" in lines[0], err


def test_a_full_disk_at_start_is_a_clear_error(tmp_path: Path) -> None:
    state_dir = tmp_path / "full"
    state_dir.mkdir()
    state = state_dir / "state.db"
    setup = (f"mount -t tmpfs -o size=64k tmpfs {state_dir} && "
             f"(dd if=/dev/zero of={state_dir}/filler bs=4k 2>/dev/null || true)")
    cmd = _serve_cmd(free_port(), _nodes(tmp_path, "http://127.0.0.1:9"), state)
    done = subprocess.run(_in_mount_ns(setup, cmd), cwd=ROOT, capture_output=True, timeout=120)
    err = done.stderr.decode()
    assert done.returncode == 2 and "Traceback" not in err, err
    assert f"cannot open state file {state}: " in err and "no space left" in err, err


def _fill(directory: Path) -> None:
    """Fill the file system of `directory` until the kernel answers ENOSPC."""
    with open(directory / "filler", "wb", buffering=0) as filler, pytest.raises(OSError) as full:
        while True:  # unbuffered: nothing left to flush (and fail) when the file closes
            filler.write(b"\0" * 4096)
    assert full.value.errno == errno.ENOSPC


def test_a_full_disk_at_run_time_is_a_counted_warning_and_routing_goes_on(
        tmp_path: Path) -> None:
    if shutil.which("nsenter") is None:
        pytest.skip("needs nsenter to read the file inside the tracker's namespace")
    head = FakeChat("n", tokens=20)
    state_dir = tmp_path / "small"
    state_dir.mkdir()
    with ServerThread(head.app()) as up:
        port = free_port()
        state = state_dir / "state.db"
        cmd = _serve_cmd(port, _nodes(tmp_path, up.url), state)
        setup = f"mount -t tmpfs -o size=512k tmpfs {state_dir}"
        with tracker(_in_mount_ns(setup, cmd), port) as proc:
            inside = Path(f"/proc/{proc.pid}/root") / state_dir.relative_to("/")
            _load(port, 10)
            _saved_since_now(port)
            assert _metric(port, "meshroute_state_write_errors_total") == 0
            _fill(inside)  # the disk is full now (seen from the tracker's namespace)
            _load(port, 30)  # routing goes on
            _samples_reach(port, 40)
            _until(lambda: _metric(port, "meshroute_state_write_errors_total") >= 3,
                   "counted write errors")
            _load(port, 10)
            assert _metric(port, "meshroute_state_unsaved") == 1
            failed = _metric(port, "meshroute_state_write_errors_total")
            (inside / "filler").unlink()  # space again: the next write saves what waited
            _until(lambda: _metric(port, "meshroute_state_unsaved") == 0, "a write again")
            _saved_since_now(port)
            # a second reader inside the tracker's namespace (SQLite resolves /proc/PID/root
            # to our own root): the file is whole, nothing learned while it was full was lost
            check = ("import sqlite3, sys; db = sqlite3.connect(sys.argv[1]); print(db.execute("
                     "'PRAGMA integrity_check').fetchone()[0], db.execute("
                     "'SELECT count FROM route_stats').fetchall())")
            enter = ["nsenter", "-t", str(proc.pid), "-m",
                     *(["-U", "--preserve-credentials"] if _mount_ns()[1] == "-rm" else [])]
            seen = subprocess.run([*enter, sys.executable, "-c", check, str(state)],
                                  capture_output=True, text=True, timeout=60)
            assert seen.stdout.split(None, 1) == ["ok", "[(50,)]\n"], seen
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
            assert proc.stderr is not None
            err = proc.stderr.read().decode()
        warnings = [line for line in err.splitlines() if "no space left on device" in line]
        assert len(warnings) == 1, err  # one warning, however many writes failed
        assert f"cannot write state file {state}" in warnings[0]
        assert "written again" in err and "Traceback" not in err, err
        print(f"\n{failed:.0f} failed writes while full, {len(warnings)} warning; 50 samples "
              "in the file after space came back")
