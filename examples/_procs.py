"""Helpers the runnable examples share: start `meshroute` processes, wait for HTTP, stop them.

Stdlib only (plus meshroute itself), so each example runs with nothing but `pip install -e .`.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

MESHROUTE = [sys.executable, "-m", "meshroute_middleware.app.cli"]
WAIT_S = 60.0  # a loaded machine imports and starts slowly; this only bounds a failure


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http(method: str, url: str, body: Any = None, timeout_s: float = 30.0,
         headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], Any]:
    """(status, headers, parsed JSON body) of one request; HTTP errors are answers too."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers={"content-type": "application/json",
                                              **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"null")


def wait_until(check: Any, what: str, timeout_s: float = WAIT_S) -> Any:
    """Poll `check()` until it returns something truthy; RuntimeError naming `what` after."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            result = check()
            if result:
                return result
        time.sleep(0.2)
    raise RuntimeError(f"timed out waiting for {what}")


@contextlib.contextmanager
def running(*args: str, ready_url: str | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """Run a process until the block ends; with `ready_url`, wait until it answers HTTP."""
    proc = subprocess.Popen(list(args))
    try:
        if ready_url is not None:
            def up() -> bool:
                if proc.poll() is not None:
                    raise RuntimeError(f"{args[:4]} exited with {proc.returncode}")
                return http("GET", ready_url, timeout_s=2)[0] > 0
            wait_until(up, ready_url)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
