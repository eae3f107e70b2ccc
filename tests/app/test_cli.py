"""The `meshroute` command refuses bad configuration before starting anything, and a Ctrl-C
while it starts up ends it quietly."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path

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


def _console_script() -> list[str]:
    """The `meshroute` console script as pip writes it, from pyproject's [project.scripts]."""
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    module, _, function = pyproject["project"]["scripts"]["meshroute"].partition(":")
    return [sys.executable, "-X", "importtime", "-c",
            f"import sys; from {module} import {function}; sys.exit({function}())"]


def test_ctrl_c_while_the_command_still_imports_exits_quietly_with_130() -> None:
    """SIGINT once the entry point runs and the CLI's imports are under way (-X importtime
    shows each import as it ends): no traceback, status 130. Wherever the signal lands (an
    import, argument parsing, the demo's first steps) the exit is quiet."""
    proc = subprocess.Popen([*_console_script(), "demo", "--plain", "--port", "0",
                             "--discovery", "http", "--seconds", "30"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    try:
        for line in proc.stderr:  # -X importtime: the CLI's package has been imported
            if re.search(r"\|\s+meshroute_middleware\.app$", line.rstrip()):
                break
        else:
            pytest.fail("the command never imported meshroute_middleware.app")
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert "Traceback" not in err, err[-3000:]
    cli_imported = re.search(r"\|\s+meshroute_middleware\.app\.cli$", err, re.M) is not None
    print("the CLI had finished importing" if cli_imported else "interrupted in the imports")
    if not cli_imported:  # the case this test is for (the imports take a second or more)
        assert proc.returncode == 130 and out == ""
    else:  # a long stall of this process: the CLI ran on, and Ctrl-C stops it quietly too
        assert proc.returncode in (0, 130)
