"""A fixed number of forward-mode chat requests, for counting instructions under callgrind:

  valgrind --tool=callgrind --callgrind-out-file=/dev/null \
      python benchmarks/forward_instructions.py 200     # and again with 1200

The per-request count is the difference of the two totals over the difference of the counts
(start-up cancels out). Same app and request as bench_overhead.py's `gateway (forward)`; with
`--stream` the request asks for a stream.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks._apps import chat
from benchmarks.bench_overhead import BODY, HEAD, SCOPE, gateway_app
from meshroute_middleware.forwarding.memory import ASGIForwarder
from meshroute_middleware.http.request import replay

STREAM_BODY = json.dumps({"model": "m", "stream": True,
                          "messages": [{"role": "user", "content": "hi"}]}).encode()


async def run(n: int, body: bytes) -> None:
    app = gateway_app(ASGIForwarder({HEAD: chat}))
    statuses: list[int] = []

    async def send(message: Any) -> None:
        if message["type"] == "http.response.start":
            statuses.append(message["status"])

    async def never() -> Any:
        await asyncio.sleep(3600)

    for _ in range(n):
        await app({**SCOPE, "state": {}}, replay(body, never), send)
    if statuses != [200] * n:
        raise SystemExit(f"not every request was answered 200: {set(statuses)}")


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    asyncio.run(run(n, STREAM_BODY if "--stream" in sys.argv else BODY))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
