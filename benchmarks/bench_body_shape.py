"""How long a body holds the event loop, by its shape (issue 32, row 8):

  python benchmarks/bench_body_shape.py [--rounds 3]
  PYTHONPATH=OLD_DIR python benchmarks/bench_body_shape.py --no-save   # another checkout

A MeshRouteMiddleware (forward mode, in process) serves each body to an in-memory head that
reads the body and answers at once (it parses nothing: the loop's gaps are the gateway's).
A 1 ms ticker on the same loop records the longest gap while the request is served; the table
shows the answer's status, its time and that gap, the least disturbed of `--rounds` rounds.
Writes benchmarks/results/body_shape.json.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import random
import time
from pathlib import Path
from typing import Any

import httpx
from starlette.types import Receive, Scope, Send

from meshroute_middleware.core import parse_node
from meshroute_middleware.forwarding.memory import ASGIForwarder
from meshroute_middleware.middleware import MeshRouteMiddleware

RESULTS = Path(__file__).parent / "results" / "body_shape.json"
ANSWER = json.dumps({"id": "c", "object": "chat.completion", "created": 0, "model": "m",
                     "choices": [{"index": 0, "finish_reason": "stop", "message": {
                         "role": "assistant", "content": "ok"}}],
                     "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                               "total_tokens": 2}}).encode()


async def head(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the body, parses nothing, answers a completion."""
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": ANSWER})


def bodies() -> list[tuple[str, bytes]]:
    tiny = (b'{"model":"m","messages":['
            + b",".join([b'{"role":"user","content":"x"}'] * 480_000) + b"]}")
    history: list[dict[str, Any]] = [{"role": "system", "content": "a coding agent"}]
    for i in range(2_500):
        history.append({"role": "assistant", "content": None, "tool_calls": [{
            "id": f"c{i}", "type": "function", "function": {
                "name": "read", "arguments": json.dumps({"path": f"src/m{i}.py"})}}]})
        history.append({"role": "tool", "tool_call_id": f"c{i}",
                        "content": "def f(x, y):\n    return {x: [y, y]}\n" * 20})
    image = "data:image/png;base64," + base64.b64encode(
        random.Random(1).randbytes(3 * 1024 * 1024)).decode()
    looks = [{"role": "user", "content": [{"type": "text", "text": "?"},
                                          {"type": "image_url", "image_url": {"url": image}}]}]
    return [
        ("480k tiny messages, 13.7 MiB", tiny),
        ("agent history, 5,001 messages, 2.4 MiB",
         json.dumps({"model": "m", "messages": history}).encode()),
        ("3 images, 12 MiB", json.dumps({"model": "m", "messages": looks * 3}).encode()),
        ("20 messages, 1 KiB", json.dumps({"model": "m", "messages": [
            {"role": "user", "content": "hello"}] * 20}).encode()),
    ]


async def _ticks(stop: asyncio.Event, gaps: list[float]) -> None:
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.001)
        now = time.perf_counter()
        gaps.append(now - last)
        last = now


async def measure(rounds: int) -> list[dict[str, Any]]:
    app = MeshRouteMiddleware(head, forwarder=ASGIForwarder({"http://node": head}))
    app.router.upsert_node(parse_node({
        "node_id": "a", "model": "m", "start": 0, "end": 9, "layers": 10,
        "url": "http://node", "tps": 10.0, "caps": ["vision", "tools"]}))
    out = []
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://gw", timeout=60) as client:
        for name, body in bodies():
            best: dict[str, Any] | None = None
            for _ in range(rounds):
                stop, gaps = asyncio.Event(), []
                ticker = asyncio.create_task(_ticks(stop, gaps))
                await asyncio.sleep(0.01)
                t0 = time.perf_counter()
                resp = await client.post("/v1/chat/completions", content=body,
                                         headers={"content-type": "application/json"})
                took = time.perf_counter() - t0
                stop.set()
                await ticker
                row = {"body": name, "bytes": len(body), "status": resp.status_code,
                       "answer_ms": round(took * 1000, 1),
                       "longest_gap_ms": round(max(gaps) * 1000, 1)}
                if best is None or row["longest_gap_ms"] < best["longest_gap_ms"]:
                    best = row
            assert best is not None
            out.append(best)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-save", action="store_true")
    args = parser.parse_args()
    rows = asyncio.run(measure(args.rounds))
    print("| body | status | answer | longest loop gap |\n|---|---:|---:|---:|")
    for r in rows:
        print(f"| {r['body']} | {r['status']} | {r['answer_ms']:,.0f} ms | "
              f"{r['longest_gap_ms']:,.0f} ms |")
    if not args.no_save:
        RESULTS.write_text(json.dumps({"at": time.strftime("%Y-%m-%d %H:%M UTC",
                                                           time.gmtime()),
                                       "load_average": os.getloadavg(), "rows": rows},
                                      indent=2) + "\n")


if __name__ == "__main__":
    main()
