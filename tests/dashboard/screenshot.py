"""Take docs/dashboard.png from a real run: two models, live traffic, the best node slowing
down half-way and a node joining later.

Run it through `scripts/dashboard-screenshot` (inside a loopback-only network namespace).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from .browser import open_page
from .mesh import LLAMA, QWEN, Shard, live_mesh

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out", type=Path, nargs="?", default=Path("docs/dashboard.png"))
    parser.add_argument("--seconds", type=float, default=60.0, help="about how long to run")
    args = parser.parse_args(argv)
    asyncio.run(_run(args.out, args.seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
