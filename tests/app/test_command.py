"""The `meshroute` command as a new user meets it, in real processes: a port in use or any
start-up failure is one line and exit status 2; Ctrl-C stops `serve` at once whatever
streams are open; `--help` is grouped, with defaults and variables; `--version`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from meshroute_middleware.app.settings import GROUPS, OPTIONS
from meshroute_middleware.core.policies import POLICIES
from tests.upstream import FakeChat, ServerThread, free_port, serve_process

STOP_WITHIN_S = 2.0  # Ctrl-C to exit, whatever streams are open (issue 21)


def meshroute(*args: str, env: dict[str, str] | None = None,
              timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshroute_middleware.app.cli", *args],
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


@contextmanager
def busy_port() -> Iterator[int]:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        yield int(busy.getsockname()[1])


@pytest.mark.parametrize("command", [
    ["serve", "--no-mdns"],
    ["serve", "--no-mdns", "--workers", "2"],
    ["node", "--emulate", "--mdns-interfaces", "127.0.0.1"],
])
def test_a_port_in_use_is_one_line_and_exit_2(command: list[str]) -> None:
    with busy_port() as port:
        proc = meshroute(*command, "--port", str(port))
    output = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(output) == 1, proc.stderr
    assert f"cannot listen on 127.0.0.1:{port} (Address already in use)" in output[0]
    assert "--port" in output[0]  # what to do about it


def test_a_background_service_that_cannot_start_is_one_error_line_and_exit_2() -> None:
    """The gossip port taken: the lifespan fails; no traceback, the reason in one line."""
    with busy_port() as gossip:
        proc = meshroute("serve", "--no-mdns", "--port", "0",
                         "--gossip-listen", f"127.0.0.1:{gossip}")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and "ExceptionGroup" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if "cannot start" in line]
    assert len(errors) == 1 and "address already in use" in errors[0].lower(), proc.stderr
    assert " ERROR " not in proc.stderr, proc.stderr  # uvicorn's traceback and chatter


def test_an_address_the_machine_lacks_is_one_line_for_the_emulator() -> None:
    proc = meshroute("node", "--emulate", "--host", "192.0.2.1", "--port", "0",
                     "--mdns-interfaces", "127.0.0.1")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "cannot listen on 192.0.2.1:0" in proc.stderr


def test_a_node_that_cannot_announce_is_one_line_and_exit_2() -> None:
    proc = meshroute("node", "--model", "m", "--shard", "0-1", "--layers", "2", "--url",
                     "http://127.0.0.1:9", "--mdns-interfaces", "192.0.2.1")  # not ours
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meshroute node: cannot announce over mDNS: ")


def test_version() -> None:
    from importlib.metadata import version

    for args in (["--version"], ["serve", "--version"]):
        proc = meshroute(*args)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == f"meshroute {version('meshroute')}"


def test_serve_help_is_grouped_with_defaults_and_variables() -> None:
    proc = meshroute("serve", "--help", env={"COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    positions = [text.index(f"\n{title}:\n") for title in GROUPS]
    assert positions == sorted(positions), "groups in their order"
    for title in ("listening", "nodes and discovery", "forwarding limits", "gossip", "state",
                  "providers", "policy"):
        assert f"\n{title}:\n" in text
    section = text[text.index("\npolicy:\n"):]
    choices = re.search(r"--policy \{([^}]*)\}", section)  # its choices: every policy's name
    assert choices is not None and set(choices.group(1).split(",")) == set(POLICIES)
    assert "(default: thompson; env MESHROUTE_POLICY)" in " ".join(section.split())
    flat = " ".join(text.split())
    assert "--port PORT port to listen on (0: any free) (default: 8080; env MESHROUTE_PORT)" \
        in flat
    assert "(default: on; env MESHROUTE_MDNS)" in flat
    assert "$XDG_STATE_HOME/meshroute/state.db" in flat
    # a secret: its variable first, the flag discouraged
    assert "--node-token NODE_TOKEN set MESHROUTE_NODE_TOKEN rather than the flag" in flat
    assert "environment only: MESHROUTE_GOSSIP_SECRET" in flat
    for opt in OPTIONS:
        for env in opt.env:
            assert env in flat, env


# -- Ctrl-C ------------------------------------------------------------------------------------

def _nodes_file(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "nodes.json"
    path.write_text(json.dumps([{"node_id": "slow", "model": "m", "start": 0, "end": 0,
                                 "layers": 1, "url": url, "tps": 10.0}]))
    return path


class _Reader(threading.Thread):
    """Reads one streaming response to its end in a thread; `lines` as they come."""

    def __init__(self, method: str, url: str, **kwargs: object) -> None:
        super().__init__(daemon=True)
        self.method, self.url, self.kwargs = method, url, kwargs
        self.lines: list[str] = []
        self.status: int | None = None
        self.ended_cleanly = False
        self.error: BaseException | None = None
        self.first = threading.Event()

    def run(self) -> None:
        try:
            with httpx.stream(self.method, self.url, timeout=30,
                              **self.kwargs) as resp:  # type: ignore[arg-type]
                self.status = resp.status_code
                for line in resp.iter_lines():
                    self.lines.append(line)
                    self.first.set()
            self.ended_cleanly = True  # the body's end, not a broken connection
        except BaseException as exc:
            self.error = exc
        finally:
            self.first.set()


def test_ctrl_c_stops_serve_at_once_with_an_event_stream_and_a_chat_stream_open(
        tmp_path: Path) -> None:
    slow = FakeChat(name="slow", tokens=400, token_delay_s=0.1)  # a 40 s answer
    with ServerThread(slow.app()) as head, serve_process(
            ["--nodes-file", str(_nodes_file(tmp_path, head.url))], tmp_path / "log"
    ) as (url, proc):
        events = _Reader("GET", f"{url}/v1/routing/events")
        chat = _Reader("POST", f"{url}/v1/chat/completions",
                       json={"model": "m", "stream": True,
                             "messages": [{"role": "user", "content": "hi"}]})
        events.start()
        chat.start()
        assert events.first.wait(20) and chat.first.wait(20)
        deadline = time.monotonic() + 20
        while len(chat.lines) < 6 and time.monotonic() < deadline:  # a few tokens in
            time.sleep(0.05)
        assert chat.status == 200 and events.status == 200
        signalled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        took = time.monotonic() - signalled
        events.join(10)
        chat.join(10)
    log = (tmp_path / "log").read_text()
    assert took < STOP_WITHIN_S, (took, log)
    assert proc.returncode in (0, 130), log
    assert "Traceback" not in log, log
    assert events.ended_cleanly, events.error
    assert any(line.startswith("event: ") for line in events.lines), events.lines  # live
    assert chat.ended_cleanly, chat.error
    assert any('"content": "t0 "' in line for line in chat.lines)  # tokens came through first
    last = [line for line in chat.lines if line.startswith("data: ")][-1]
    assert json.loads(last[len("data: "):])["error"]["code"] == "shutting_down", chat.lines
    assert slow.cancelled == 1  # the head's request ended with it


def test_ctrl_c_ends_a_responses_stream_at_once(tmp_path: Path) -> None:
    """/v1/responses streams are drained like chat streams: ended with the SSE error event."""
    slow = FakeChat(name="slow", tokens=400, token_delay_s=0.1)  # a 40 s answer
    with ServerThread(slow.app()) as head, serve_process(
            ["--nodes-file", str(_nodes_file(tmp_path, head.url))], tmp_path / "log"
    ) as (url, proc):
        stream = _Reader("POST", f"{url}/v1/responses",
                         json={"model": "m", "stream": True, "input": "hi"})
        stream.start()
        assert stream.first.wait(20)
        deadline = time.monotonic() + 20
        while len(stream.lines) < 12 and time.monotonic() < deadline:  # a few tokens in
            time.sleep(0.05)
        assert stream.status == 200
        signalled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        took = time.monotonic() - signalled
        stream.join(10)
    log = (tmp_path / "log").read_text()
    assert took < STOP_WITHIN_S, (took, log)
    assert "Traceback" not in log, log
    assert stream.ended_cleanly, stream.error
    assert "event: response.output_text.delta" in stream.lines  # translated, as it came
    last = [line for line in stream.lines if line.startswith("data: ")][-1]
    assert json.loads(last[len("data: "):])["error"]["code"] == "shutting_down", stream.lines
    assert slow.cancelled == 1


@pytest.mark.alone
def test_ctrl_c_stops_workers_at_once_with_event_streams_open(tmp_path: Path) -> None:
    """--workers 2: the parent relays Ctrl-C to both; each drains its own streams."""
    with serve_process(["--workers", "2"], tmp_path / "log") as (url, proc):
        readers = [_Reader("GET", f"{url}/v1/routing/events") for _ in range(4)]
        for reader in readers:  # the kernel spreads them over both workers
            reader.start()
        assert all(reader.first.wait(20) for reader in readers)
        signalled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        took = time.monotonic() - signalled
        for reader in readers:
            reader.join(10)
    log = (tmp_path / "log").read_text()
    assert took < STOP_WITHIN_S, (took, log)
    assert proc.returncode == 0 and "Traceback" not in log, log
    assert all(reader.ended_cleanly for reader in readers), [r.error for r in readers]


def test_ctrl_c_answers_a_request_still_waiting_for_its_head_with_a_503(
        tmp_path: Path) -> None:
    stalled = FakeChat(name="stalled", header_delay_s=60)
    with ServerThread(stalled.app()) as head, serve_process(
            ["--nodes-file", str(_nodes_file(tmp_path, head.url))], tmp_path / "log"
    ) as (url, proc):
        waiting = _Reader("POST", f"{url}/v1/chat/completions",
                          json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        waiting.start()
        deadline = time.monotonic() + 20
        while not stalled.seen and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stalled.seen
        signalled = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
        took = time.monotonic() - signalled
        waiting.join(10)
    assert took < STOP_WITHIN_S, took
    assert waiting.status == 503, waiting.lines
    assert json.loads("".join(waiting.lines))["error"]["code"] == "shutting_down"


def test_serve_logs_in_one_format(tmp_path: Path) -> None:
    with serve_process(["--log-level", "info"], tmp_path / "log") as (url, proc):
        httpx.get(f"{url}/healthz")
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
    lines = [line for line in (tmp_path / "log").read_text().splitlines() if line.strip()]
    pattern = r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR) [\w.]+: "
    assert lines and all(re.match(pattern, line) for line in lines), lines
    assert any(" meshroute.serve: tracker " in line for line in lines), lines
    assert any(" uvicorn: " in line for line in lines), lines  # uvicorn's, in the same format


def test_port_0_is_logged_as_the_port_it_became() -> None:
    proc = subprocess.Popen([sys.executable, "-m", "meshroute_middleware.app.cli", "serve",
                             "--no-mdns", "--port", "0"], stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    try:
        for line in proc.stderr:
            if " meshroute.serve: tracker " in line:
                url = line.split(" on ")[1].split()[0]
                break
        else:
            pytest.fail("no tracker line")
        assert not url.endswith(":0")
        deadline = time.monotonic() + 20
        while True:  # the line may come just before uvicorn serves
            try:
                assert httpx.get(f"{url}/healthz", timeout=2).status_code == 200
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium")
def test_the_demo_stops_quietly_with_a_dashboard_open_in_chromium(tmp_path: Path) -> None:
    """Ctrl-C on the demo while headless Chromium holds the dashboard (and its EventSource,
    which reconnects by itself) open: the summary, and no traceback before it."""
    port = free_port()
    demo = subprocess.Popen([sys.executable, "-m", "meshroute_middleware.app.cli", "demo",
                             "--plain", "--discovery", "http", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    browser = None
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert demo.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        browser = subprocess.Popen(
            ["chromium", "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", f"--user-data-dir={tmp_path / 'profile'}",
             "--remote-debugging-port=0",  # stays open with the page loaded
             f"http://127.0.0.1:{port}/dashboard"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not _has_event_stream(port):  # the dashboard's EventSource is open
            assert time.monotonic() < deadline, "the dashboard never opened its event stream"
            time.sleep(0.2)
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=60)
    finally:
        if browser is not None:
            browser.kill()
            browser.wait()
        demo.kill()
        demo.wait()
    assert demo.returncode == 0, err
    assert "Traceback" not in out + err and " ERROR " not in out + err, err
    assert "summary:" in out


def _has_event_stream(port: int) -> bool:
    try:
        text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
    except httpx.TransportError:
        return False
    for line in text.splitlines():
        if line.startswith("meshroute_event_subscribers "):
            return float(line.split()[-1]) >= 1
    return False
