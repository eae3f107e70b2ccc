"""The `meshroute` command refuses bad configuration before starting anything."""

from __future__ import annotations

import subprocess
import sys

import pytest


def meshroute(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshroute_middleware.app.cli", *args],
                          capture_output=True, text=True, timeout=30, env=env)


@pytest.mark.parametrize(("args", "message"), [
    (("serve", "--mdns-interfaces", "bogus"), "'bogus' is not an IP address"),
    (("serve", "--route-explore-share", "1.5"), "--route-explore-share: explore_share"),
    (("serve", "--no-mdns", "--policy", "nope"), "unknown policy 'nope'"),
    (("serve", "--no-mdns", "--nodes-file", "/nonexistent.json"), "cannot read nodes file"),
    (("serve", "--no-mdns", "--gossip-listen", "127.0.0.1:7946", "--gossip-secret-file",
      "/nonexistent"), "cannot read gossip secret file"),
    (("serve", "--no-mdns", "--gossip-peer", "nonsense"), "nonsense"),
])
def test_serve_refuses_bad_configuration(args: tuple[str, ...], message: str) -> None:
    proc = meshroute(*args)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_no_command_prints_help() -> None:
    proc = meshroute()
    assert proc.returncode == 2 and "serve" in proc.stdout and "demo" in proc.stdout


def test_demo_on_a_busy_port_says_so() -> None:
    import socket

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = meshroute("demo", "--port", str(port), "--duration", "1", "--plain")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in proc.stderr
