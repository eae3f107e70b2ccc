"""examples/starlette_annotate and examples/fastapi_annotate: an existing chat app wrapped in
annotate mode serves the chat itself, is told the plan, and meshroute learns from it."""

from __future__ import annotations

import subprocess
import sys
import time

import httpx
import pytest

from ..upstream import free_port
from .run import EXAMPLES, load_example

APPS = ["starlette_annotate/app.py", "fastapi_annotate/app.py"]


@pytest.mark.parametrize("script", APPS)
def test_the_wrapped_app_serves_is_told_the_plan_and_is_measured(script: str) -> None:
    if script.startswith("fastapi"):
        pytest.importorskip("fastapi")
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(EXAMPLES / script), "--port", str(port)],
                            stderr=subprocess.PIPE, text=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            _wait_up(client, proc)
            for _ in range(3):
                resp = client.post("/v1/chat/completions",
                                   json={"model": "tiny", "messages": []})
                assert resp.status_code == 200, resp.text
                route = resp.headers["x-meshroute-route"]
                chain = route.split("|", 1)[1].split("->")
                told = resp.json()["choices"][0]["message"]["content"]
                # The app answered itself, naming the plan meshroute gave it.
                assert " -> ".join(hop.split("[")[0] for hop in chain) in told
                assert f"route {route})" in told
            assert _samples(client) == 3
            assert client.get("/dashboard").status_code == 200
    finally:
        proc.terminate()
        proc.wait(15)
    assert proc.stderr is not None
    err = proc.stderr.read()
    assert "Traceback" not in err, err[-3000:]


def _samples(client: httpx.Client) -> int:
    """Samples /v1/routing reports, once its one-second cache shows the latest ones."""
    samples = 0
    for _ in range(100):
        table = client.get("/v1/routing").json()["models"]["tiny"]["candidates"]
        samples = sum(row["samples"] for row in table)
        if samples >= 3:
            break
        time.sleep(0.1)
    return samples


def _wait_up(client: httpx.Client, proc: subprocess.Popen[str]) -> None:
    for _ in range(600):
        assert proc.poll() is None, "the example exited"
        try:
            client.get("/v1/routing", timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.1)
    raise AssertionError("the example did not start")


@pytest.mark.parametrize("script", APPS)
def test_the_example_builds_in_process(script: str) -> None:
    if script.startswith("fastapi"):
        pytest.importorskip("fastapi")
    module = load_example(script)
    assert callable(module.build)  # type: ignore[attr-defined]
