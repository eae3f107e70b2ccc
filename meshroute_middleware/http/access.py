"""Who may change or read the gateway's private state: a bearer token when one is set, else a
loopback peer (the one loopback rule: http/guard.py's `is_loopback_host`)."""

from __future__ import annotations

import hmac

from starlette.requests import Request

from meshroute_middleware.http.guard import is_loopback_host

__all__ = ["has_bearer", "is_loopback_client", "peer_of"]


def is_loopback_client(request: Request) -> bool:
    """Whether the peer of this connection is a loopback address (127.0.0.0/8, ::1)."""
    return request.client is not None and is_loopback_host(request.client.host)


def has_bearer(request: Request, token: str | None) -> bool:
    """Whether the request's Authorization is `Bearer <token>` (compared in constant time);
    never when no token is set."""
    if not token:
        return False
    given = request.headers.get("authorization", "")
    return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())


def peer_of(request: Request) -> str:
    """The peer's address as logs show it (at most 64 characters)."""
    return (request.client.host if request.client else "unknown")[:64]
