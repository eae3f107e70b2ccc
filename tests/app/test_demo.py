"""`meshroute demo` runs a whole mesh end to end and learns; the dashboard is served."""

from __future__ import annotations

import re
import subprocess
import sys

import httpx
import pytest

from ..upstream import free_port


@pytest.mark.parametrize("discovery", ["mdns", "http"])
def test_demo_finds_its_nodes_serves_and_learns_every_route(discovery: str) -> None:
    port = free_port()
    proc = subprocess.run(
        [sys.executable, "-m", "meshroute_middleware.app.cli", "demo", "--duration", "7",
         "--plain", "--port", str(port), "--drift-after", "0", "--clients", "4",
         "--discovery", discovery], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]  # a clean shutdown too
    out = proc.stdout
    found = "the gateway discovered all 5 nodes" in out
    assert found == (discovery == "mdns"), out[:2000] + proc.stderr[-2000:]
    final = out[out.rindex("ok "):]
    served = int(re.search(r"ok (\d+) failed (\d+)", final).group(1))  # type: ignore[union-attr]
    failed = int(re.search(r"ok (\d+) failed (\d+)", final).group(2))  # type: ignore[union-attr]
    assert served >= 20 and failed == 0
    rows = [line for line in final.splitlines() if "[" in line and "]" in line]
    assert len(rows) == 4  # two hybrid routes and two single-node routes
    assert all(line.rstrip().endswith("proven") for line in rows), final
    for line in rows:
        # Learned tok/s against what the emulator does on an idle machine: never much faster,
        # and slower only by as much as a loaded 2-core machine slows the emulator down.
        learned, true = (float(x) for x in line.split()[1:3])
        assert true / 4 < learned < true * 1.35, line


def test_dashboard_page_is_served() -> None:
    from dataclasses import replace

    from meshroute_middleware.app.serve import build_gateway
    from meshroute_middleware.app.settings import ServeSettings

    from ..upstream import ServerThread

    gateway = build_gateway(replace(ServeSettings(), mdns=False))
    with ServerThread(gateway.app) as server:
        resp = httpx.get(server.url + "/dashboard")
        assert resp.status_code == 200 and "text/html" in resp.headers["content-type"]
        assert "Routing (learned)" in resp.text and "/v1/routing/events" in resp.text
