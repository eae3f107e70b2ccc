"""Serve an ASGI app with uvicorn inside the caller's event loop; the caller owns signals."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Generator
from typing import Any

import anyio
import uvicorn

STARTUP_TIMEOUT_S = 10.0


class _Server(uvicorn.Server):
    """A uvicorn server that leaves signal handling to whoever runs it."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


@contextlib.asynccontextmanager
async def serve_app(app: Any, host: str = "127.0.0.1", port: int = 0, *,
                    graceful_s: int | None = None) -> AsyncIterator[str]:
    """Run `app` on host:port (0: any free port) and yield its base URL until the exit;
    `graceful_s` bounds how long the exit waits for open connections (an SSE stream never
    ends by itself; None: wait for them all)."""
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                            access_log=False, timeout_graceful_shutdown=graceful_s)
    server = _Server(config)
    async with anyio.create_task_group() as tg:
        tg.start_soon(server.serve)
        with anyio.fail_after(STARTUP_TIMEOUT_S):
            while not server.started:
                if server.should_exit:
                    raise RuntimeError(f"uvicorn could not start on {host}:{port}")
                await anyio.sleep(0.01)
        bound_port = server.servers[0].sockets[0].getsockname()[1]
        try:
            yield f"http://{host}:{bound_port}"
        finally:
            server.should_exit = True
