"""Take docs/dashboard.png from a real run: two models, live traffic, the best node slowing
down half-way and a node joining later; or (`--demo`) from a running `meshroute demo`, its
provider chain included.

Run it through `scripts/dashboard-screenshot` (inside a loopback-only network namespace).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import subprocess
import sys
from pathlib import Path

from ..upstream import free_port
from .browser import open_page
from .mesh import LLAMA, QWEN, Shard, live_mesh

COOLING = "document.querySelector('#chains .key.cooldown') !== null"
LATE = Shard("cpu-b", "qwen-demo", 0, 39, 40, 22.0)  # joins half-way: a topology marker


async def _run(out: Path, seconds: float) -> None:
    async with live_mesh(QWEN + LLAMA) as mesh, open_page(mesh.url + "/dashboard") as page:
        await page.wait_for("document.body.dataset.polls > 0", 60)
        rounds = max(2, int(seconds / 3))
        for i in range(rounds):
            await mesh.traffic(["qwen-demo", "llama-8b"], 24, clients=3, seed=i)
            if i == rounds // 2:
                mesh.slow_down("gpu-a", 3.0)
            if i == rounds * 3 // 4:
                await mesh.start_node(LATE, seed=99)
                await mesh.register(LATE)
        await asyncio.sleep(1.5)  # one more debounced poll after the last request
        await page.screenshot(out)
    print(f"wrote {out} ({mesh.ok} requests ok, {mesh.failed} failed)")


async def _run_demo(out: Path, seconds: float) -> None:
    """`meshroute demo` on 127.0.0.1 in a process of its own; the page opened once it serves,
    the screenshot `seconds` later; then Ctrl-C."""
    port = free_port()
    demo = subprocess.Popen(
        [sys.executable, "-m", "meshroute_middleware.app.cli", "demo", "--plain", "--port",
         str(port), "--leave-after", str(seconds * 0.3), "--join-after", str(seconds * 0.5),
         "--drift-after", str(seconds * 0.7)], stdout=subprocess.PIPE, text=True)
    try:
        assert demo.stdout is not None
        for line in demo.stdout:  # the banner: the mesh is up and traffic starts
            if "dashboard" in line:
                break
        async with open_page(f"http://127.0.0.1:{port}/dashboard") as page:
            await asyncio.sleep(seconds)
            with contextlib.suppress(TimeoutError):  # a key cooling down, if one comes soon
                await page.wait_for(COOLING, 60)
            await page.screenshot(out)
    finally:
        demo.send_signal(signal.SIGINT)
        rest, _ = demo.communicate(timeout=30)
    print(f"wrote {out}; the demo said: {rest.strip().splitlines()[-1]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path, nargs="?", default=Path("docs/dashboard.png"))
    parser.add_argument("--seconds", type=float, default=60.0, help="about how long to run")
    parser.add_argument("--demo", action="store_true",
                        help="screenshot a running `meshroute demo` (provider chain included)")
    args = parser.parse_args(argv)
    asyncio.run((_run_demo if args.demo else _run)(args.out, args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
