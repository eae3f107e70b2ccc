"""`meshroute mitm` with a port in use: one line and exit status 2 before mitmdump starts."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("mitmproxy")


@pytest.mark.parametrize("flag", ["--listen-port", "--side-port"])
def test_a_port_in_use_is_one_line_and_exit_2(flag: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        other = "--side-port" if flag == "--listen-port" else "--listen-port"
        proc = subprocess.run(
            [sys.executable, "-m", "meshroute_middleware.app.cli", "mitm", "--no-mdns",
             flag, str(port), other, "0"], capture_output=True, text=True, timeout=60,
            env=os.environ)
    lines = (proc.stdout + proc.stderr).strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert lines == [f"meshroute mitm: cannot listen on 127.0.0.1:{port} (Address already in "
                     f"use); choose another port with {flag}"]
