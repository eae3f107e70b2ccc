"""`meshroute serve --workers N`: N processes on one port, each its own origin, sharing
learned statistics over loopback gossip."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from meshroute_middleware.app.config import workers_base_id
from meshroute_middleware.app.settings import ServeSettings, SettingsError, load_settings
from meshroute_middleware.app.workers import worker_settings

from ..upstream import FakeChat, ServerThread, free_port

ROOT = Path(__file__).resolve().parents[2]


def test_each_worker_gossips_with_its_siblings_on_loopback_under_one_secret() -> None:
    base = ServeSettings(mdns=False, workers=3, gossip_peers=("10.0.0.9:7000",))
    configs = [worker_settings(base, i, [7001, 7002, 7003], "t", "s3") for i in range(3)]
    assert [c.tracker_id for c in configs] == ["t-w0", "t-w1", "t-w2"]
    assert configs[1].gossip_listen == "127.0.0.1:7002"
    assert configs[1].gossip_peers == ("127.0.0.1:7001", "127.0.0.1:7003", "10.0.0.9:7000")
    assert {c.gossip_secret for c in configs} == {"s3"} and all(c.workers == 1 for c in configs)
    with pytest.raises(SettingsError, match="workers"):
        load_settings({"workers": 0})


def _tracker_and_samples(url: str) -> tuple[str, int]:
    with httpx.Client(base_url=url, timeout=10) as client:  # one connection: one worker
        tracker = client.get("/healthz").json()["tracker"]
        rows = client.get("/v1/routing").json()["models"]["m"]["candidates"]
        return tracker, sum(r["samples"] for r in rows)


def test_a_sample_learned_in_one_worker_reaches_the_others(tmp_path: Path) -> None:
    head = FakeChat("n", tokens=20)
    with ServerThread(head.app()) as up:
        nodes = tmp_path / "nodes.json"
        nodes.write_text(json.dumps([{"node_id": "n", "model": "m", "start": 0, "end": 9,
                                      "layers": 10, "url": up.url, "tps": 10.0}]))
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = subprocess.Popen([sys.executable, "-m", "meshroute_middleware.app.cli", "serve",
                                 "--workers", "2", "--port", str(port), "--no-mdns",
                                 "--nodes-file", str(nodes), "--gossip-interval", "0.2",
                                 "--log-level", "warning"], cwd=ROOT)
        try:
            seen: dict[str, int] = {}
            deadline = time.monotonic() + 60
            while len(seen) < 2:  # every new connection lands on one of the workers
                assert time.monotonic() < deadline and proc.poll() is None, seen
                try:
                    tracker, samples = _tracker_and_samples(url)
                except httpx.TransportError:
                    time.sleep(0.1)
                    continue
                seen[tracker] = samples
            assert len({t.rsplit("-w", 1)[0] for t in seen}) == 1 and set(seen.values()) == {0}
            resp = httpx.post(url + "/v1/chat/completions", timeout=10,
                              json={"model": "m", "messages": []})
            assert resp.status_code == 200
            learned_at = time.monotonic()
            have: dict[str, int] = {}
            while len(have) < 2 or set(have.values()) != {1}:  # each worker counts it once
                assert time.monotonic() < learned_at + 30, have
                tracker, samples = _tracker_and_samples(url)
                have[tracker] = samples
            print(f"a sample reached both workers within {time.monotonic() - learned_at:.2f} s")
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0


def test_workers_come_back_under_the_origins_their_state_file_names() -> None:
    assert workers_base_id("tracker-abc123-w1") == "tracker-abc123"
    assert workers_base_id("edge-w-w12") == "edge-w"
    for other in (None, "tracker-abc123", "tracker-w", "-w0", "tracker-wx"):
        assert workers_base_id(other) is None, other


def _trackers(url: str, n: int, proc: subprocess.Popen[bytes]) -> set[str]:
    seen: set[str] = set()
    deadline = time.monotonic() + 60
    while len(seen) < n:  # every new connection lands on one of the workers
        assert time.monotonic() < deadline and proc.poll() is None, seen
        try:
            seen.add(httpx.get(url + "/healthz", timeout=10).json()["tracker"])
        except httpx.TransportError:
            time.sleep(0.1)
    return seen


def test_restarted_workers_keep_their_origins_with_a_state_file(tmp_path: Path) -> None:
    """Without --tracker-id, workers restarted on the same state file come back as the same
    origins (before, each restart made new ones and the old ones' entries lingered)."""
    runs = []
    for _ in range(2):
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "meshroute_middleware.app.cli", "serve",
                                 "--workers", "2", "--port", str(port), "--no-mdns",
                                 "--state-file", str(tmp_path / "state.db"),
                                 "--log-level", "warning"], cwd=ROOT)
        try:
            runs.append(_trackers(f"http://127.0.0.1:{port}", 2, proc))
        finally:
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(20) == 0
    first, second = runs
    assert len(first) == 2 and first == second, runs


def _children(pid: int) -> set[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return {int(x) for x in out.split()}


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"  # a zombie has exited, its parent gone before reaping it


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_workers_end_when_their_supervisor_is_killed(tmp_path: Path) -> None:
    """SIGKILL leaves the supervisor no chance to stop its workers: they end by themselves
    rather than serve on, orphaned, on the shared port."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "meshroute_middleware.app.cli", "serve",
                             "--workers", "2", "--port", str(port), "--no-mdns",
                             "--log-level", "warning"], cwd=ROOT)
    try:
        deadline = time.monotonic() + 60
        while len(workers := _children(proc.pid)) < 2 or not _healthy(port):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait(10)
    deadline = time.monotonic() + 60
    try:
        while any(_alive(w) for w in workers):
            assert time.monotonic() < deadline, "workers outlived their supervisor"
            time.sleep(0.1)
    finally:  # never leave one serving if the check failed
        for w in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(w, signal.SIGKILL)


def _healthy(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False
