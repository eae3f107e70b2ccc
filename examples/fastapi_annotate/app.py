"""An existing FastAPI chat app, wrapped by meshroute in annotate mode.

FastAPI is Starlette underneath: `app.add_middleware(MeshRouteMiddleware, config=...)` wraps
it like any ASGI middleware. The app keeps serving /v1/chat/completions; meshroute tells it the
plan (`request.state.meshroute`, `x-meshroute-plan`) and learns from every answer.

    .venv/bin/pip install fastapi
    .venv/bin/python examples/fastapi_annotate/app.py --port 8000
    curl -s localhost:8000/v1/chat/completions -d '{"model": "tiny", "messages": []}'
    curl -s localhost:8000/v1/routing
"""

from __future__ import annotations

import argparse
from typing import Any

import uvicorn
from fastapi import FastAPI, Request

from meshroute_middleware.api import GatewayAPI
from meshroute_middleware.core import parse_node
from meshroute_middleware.mesh import Mesh
from meshroute_middleware.middleware import MeshRouteMiddleware, MiddlewareConfig, build_router
from meshroute_middleware.telemetry.metrics import Telemetry

NODES = [
    {"node_id": "gpu-a", "model": "tiny", "start": 0, "end": 11, "layers": 24,
     "url": "http://127.0.0.1:9001", "tps": 80},
    {"node_id": "cpu-b", "model": "tiny", "start": 12, "end": 23, "layers": 24,
     "url": "http://127.0.0.1:9002", "tps": 40},
    {"node_id": "cpu-c", "model": "tiny", "start": 0, "end": 23, "layers": 24,
     "url": "http://127.0.0.1:9003", "tps": 25},
]


def build() -> FastAPI:
    """The FastAPI app with meshroute in annotate mode and the tracker's endpoints."""
    router = build_router()  # one Router, shared by the middleware and the endpoints
    telemetry = Telemetry(router)
    for record in NODES:
        router.upsert_node(parse_node(record))
    app = FastAPI()

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> dict[str, Any]:
        body = await request.json()
        told = getattr(request.state, "meshroute", None) or {}
        chain = " -> ".join(hop["node_id"] for hop in told.get("plan", [])) or "no plan"
        text = f"hello from FastAPI (meshroute planned: {chain}; route {told.get('signature')})"
        tokens = len(text.split())
        return {"id": "chatcmpl-example", "object": "chat.completion",
                "model": body.get("model"),
                "choices": [{"index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": text}}],
                "usage": {"prompt_tokens": 1, "completion_tokens": tokens,
                          "total_tokens": tokens + 1}}

    api = GatewayAPI(Mesh(router, telemetry))
    app.router.routes += [r for r in api.routes() if r.path != "/v1/chat/completions"]
    app.add_middleware(MeshRouteMiddleware, config=MiddlewareConfig(mode="annotate"),
                       router=router, telemetry=telemetry)
    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(build(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
