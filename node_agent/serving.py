"""Serve an ASGI app with uvicorn inside the caller's event loop; the caller owns signals.
`listen_socket` is every command's listening socket: a port in use is one ListenError line."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator, Generator
from typing import Any

import anyio
import uvicorn

from meshroute_middleware.core.errors import MeshRouteError

STARTUP_TIMEOUT_S = 10.0
BACKLOG = 2048  # uvicorn's default


class ListenError(MeshRouteError, OSError):
    """host:port cannot be listened on; the message says why, in one line."""


def listen_socket(host: str, port: int, *, reuse_port: bool = False,
                  listen: bool = True) -> socket.socket:
    """A TCP socket bound to host:port (0: any free port), listening unless told otherwise
    (as uvicorn binds: SO_REUSEADDR, IPv6 for an address with a colon); ListenError if the
    address is taken or cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
        if listen:
            sock.listen(BACKLOG)
    except OSError as exc:
        sock.close()
        reason = exc.strerror or str(exc)
        raise ListenError(exc.errno, f"cannot listen on {host}:{port} ({reason})") from exc
    return sock


def one_line(exc: BaseException) -> str:
    """A failure in one line: the first exception an exception group holds, and of one
    raised while handling another, the other (the original failure); by its message, or its
    class name when it has none."""
    while True:
        if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]
        elif exc.__context__ is not None and exc.__cause__ is None \
                and not exc.__suppress_context__:
            exc = exc.__context__
        else:
            break
    if isinstance(exc, OSError) and exc.strerror and not exc.filename:
        return exc.strerror
    return str(exc) or type(exc).__name__


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
    sock = listen_socket(host, port)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="on",
                            access_log=False, timeout_graceful_shutdown=graceful_s)
    server = _Server(config)
    with contextlib.closing(sock):  # uvicorn closes it too, once it started
        async with anyio.create_task_group() as tg:
            tg.start_soon(server.serve, [sock])
            with anyio.fail_after(STARTUP_TIMEOUT_S):
                while not server.started:
                    if server.should_exit:
                        raise RuntimeError(f"uvicorn could not start on {host}:{port}")
                    await anyio.sleep(0.01)
            try:
                yield f"http://{host}:{sock.getsockname()[1]}"
            finally:
                server.should_exit = True
