"""An existing Starlette chat app, wrapped by meshroute in annotate mode.

The app keeps serving /v1/chat/completions itself; meshroute picks a route of mesh nodes for
each request, tells the app the plan (headers `x-meshroute-route` / `x-meshroute-plan` and
`scope["state"]["meshroute"]`), measures the answer and learns. The tracker's endpoints
(/v1/routing, /v1/routing/events, /metrics, /dashboard) are added to the same app.

    .venv/bin/python examples/starlette_annotate/app.py --port 8000
    curl -s localhost:8000/v1/chat/completions -d '{"model": "tiny", "messages": []}'
    curl -s localhost:8000/v1/routing
"""

from __future__ import annotations

import argparse
import json

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from meshroute_middleware.api import GatewayAPI
from meshroute_middleware.core import parse_node
from meshroute_middleware.mesh import Mesh
from meshroute_middleware.middleware import MeshRouteMiddleware, MiddlewareConfig

# Where the model "tiny" runs: two chains the app could send a request down. Replace with your
# own nodes (or feed the Router from discovery, see the README).
NODES = [
    {"node_id": "gpu-a", "model": "tiny", "start": 0, "end": 11, "layers": 24,
     "url": "http://127.0.0.1:9001", "tps": 80},
    {"node_id": "cpu-b", "model": "tiny", "start": 12, "end": 23, "layers": 24,
     "url": "http://127.0.0.1:9002", "tps": 40},
    {"node_id": "cpu-c", "model": "tiny", "start": 0, "end": 23, "layers": 24,
     "url": "http://127.0.0.1:9003", "tps": 25},
]


async def chat(request: Request) -> JSONResponse:
    """The app's own chat endpoint: it answers, naming the chain meshroute planned for it."""
    body = await request.json()
    told = request.scope.get("state", {}).get("meshroute", {})
    plan = json.loads(request.headers.get("x-meshroute-plan", "[]"))
    chain = " -> ".join(hop["node_id"] for hop in plan) or "no plan"
    text = f"hello from the app (meshroute planned: {chain}; route {told.get('signature')})"
    tokens = len(text.split())
    return JSONResponse({
        "id": "chatcmpl-example", "object": "chat.completion", "model": body.get("model"),
        "choices": [{"index": 0, "finish_reason": "stop",
                     "message": {"role": "assistant", "content": text}}],
        "usage": {"prompt_tokens": 1, "completion_tokens": tokens, "total_tokens": tokens + 1},
    })


def build() -> MeshRouteMiddleware:
    """The existing app, wrapped; the tracker's endpoints added beside its own."""
    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])
    wrapped = MeshRouteMiddleware(app, MiddlewareConfig(mode="annotate"))
    for record in NODES:
        wrapped.router.upsert_node(parse_node(record))
    api = GatewayAPI(Mesh(wrapped.router, wrapped.telemetry))
    app.router.routes += [r for r in api.routes() if r.path != "/v1/chat/completions"]
    return wrapped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    uvicorn.run(build(), host="127.0.0.1", port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
