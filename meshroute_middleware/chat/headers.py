"""meshroute's own headers: the plan sent with a request, the route and mode on a response.

A client (or a head) never gets to set them: whatever x-meshroute-* it sent is dropped, so
everyone downstream sees exactly one plan, the gateway's. (ASGI gives request header names in
lower case; a response's are lowered before they are compared.)

Credentials stay home (docs/security.md, "The HTTP edge"): a client's `authorization`,
`cookie`, `proxy-authorization` and `x-api-key` are never sent to a mesh node unless named in
the `--forward-header` allow-list, and a node's answer loses `set-cookie` and its hop-by-hop
headers, and its `date` and `server` (the gateway's server sends its own: one of each).
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import Scope

from meshroute_middleware.core import Decision, Route
from meshroute_middleware.core.contracts.cache import CACHE_HEADER
from meshroute_middleware.core.contracts.plan import MODE_HEADER, PLAN_HEADER, ROUTE_HEADER

Headers = list[tuple[bytes, bytes]]
H_ROUTE, H_PLAN, H_MODE = ROUTE_HEADER.encode(), PLAN_HEADER.encode(), MODE_HEADER.encode()
OURS = b"x-meshroute-"
H_ATTEMPTS = b"x-meshroute-attempts"  # how many routes an answer took (the chain, a failover)
_HOP_BY_HOP_REQUEST = frozenset({
    b"host", b"content-length", b"connection", b"keep-alive", b"transfer-encoding",
    b"upgrade", b"te", b"trailer", b"proxy-authorization", b"proxy-connection",
    b"accept-encoding",
})
# A client's credentials for the gateway, not for whichever node a route leads to.
CREDENTIALS = frozenset({b"authorization", b"cookie", b"proxy-authorization", b"x-api-key"})
# What a node's answer never brings to the client.
# A node's own x-meshroute-* response headers that reach the client: whether the prompt's
# prefix was warm in its cache (contracts/cache.py). Every other one is the gateway's to set.
_PASSED_OURS = frozenset({CACHE_HEADER.encode()})
_DROPPED_RESPONSE = frozenset({
    b"set-cookie", b"set-cookie2", b"date", b"server", b"connection", b"keep-alive",
    b"proxy-authenticate", b"proxy-connection", b"te", b"trailer", b"transfer-encoding",
    b"upgrade",
})

# A route's signature and plan header, encoded once per route object: docs/benchmarks.md
# records the gain (encoding the plan is JSON over every hop, on every request).
_PLAN_CACHE: dict[str, tuple[Route, bytes, bytes]] = {}
_PLAN_CACHE_MAX = 4096


def _encoded(route: Route) -> tuple[Route, bytes, bytes]:
    cached = _PLAN_CACHE.get(route.signature)
    if cached is not None and cached[0] is route:
        return cached
    if len(_PLAN_CACHE) >= _PLAN_CACHE_MAX:
        _PLAN_CACHE.clear()
    cached = _PLAN_CACHE[route.signature] = (
        route, route.signature.encode(), route.plan_header().encode())
    return cached


def plan_headers(decision: Decision) -> Headers:
    """The plan of a decision as request headers for a head (or the annotated app)."""
    _, signature, plan = _encoded(decision.route)
    return [(H_ROUTE, signature), (H_PLAN, plan), (H_MODE, decision.mode.encode())]


def response_headers(decision: Decision) -> Headers:
    """What every response of a routed request carries: its route and mode."""
    return [(H_ROUTE, _encoded(decision.route)[1]), (H_MODE, decision.mode.encode())]


def with_ours(headers: Iterable[tuple[bytes, bytes]], decision: Decision) -> Headers:
    """Response headers with the gateway's route and mode, and nobody else's."""
    out = [(k, v) for k, v in headers if not k.lower().startswith(OURS)]
    out += ((H_ROUTE, _encoded(decision.route)[1]), (H_MODE, decision.mode.encode()))
    return out


def from_node(headers: Iterable[tuple[bytes, bytes]], decision: Decision) -> Headers:
    """A node's response headers as the client gets them: no cookies, no hop-by-hop, no
    date/server of the node's (the gateway's server adds its own), our route and mode."""
    out = node_headers(headers)
    out += ((H_ROUTE, _encoded(decision.route)[1]), (H_MODE, decision.mode.encode()))
    return out


def node_headers(headers: Iterable[tuple[bytes, bytes]]) -> Headers:
    """A node's response headers less what never reaches a client (`from_node` without our
    route and mode; the mitm relay uses it too)."""
    return [(k, v) for k, v in headers
            if (low := k.lower()) not in _DROPPED_RESPONSE
            and (not low.startswith(OURS) or low in _PASSED_OURS)]


def allow_list(names: Iterable[str]) -> frozenset[bytes]:
    """The `--forward-header` names as ASGI compares them (lower-case bytes)."""
    return frozenset(n.strip().lower().encode("latin-1") for n in names if n.strip())


def annotated(scope: Scope, decision: Decision) -> Headers:
    """A client's request headers with the plan in place of any x-meshroute-* it sent."""
    _, signature, plan = _encoded(decision.route)
    out = [(k, v) for k, v in scope.get("headers", ()) if not k.startswith(OURS)]
    out += ((H_ROUTE, signature), (H_PLAN, plan), (H_MODE, decision.mode.encode()))
    return out


def forwardable(scope: Scope, allowed: frozenset[bytes] = frozenset()) -> Headers:
    """A client's request headers worth forwarding to a node: no hop-by-hop, no
    x-meshroute-*, and no credentials unless `allowed` names them."""
    return [(k, v) for k, v in scope.get("headers", ())
            if k not in _HOP_BY_HOP_REQUEST and not k.startswith(OURS)
            and (k not in CREDENTIALS or k in allowed)]


# Loops (issue 22): every chat request the gateway routes gets its own `via` entry (RFC 9110
# §7.6.3: a proxy adds one, and finding its own means the request came back through it); a
# node URL that leads back to the gateway is refused at registration (mesh.py), this catches
# the rest (a name or a proxy in between).
VIA = b"via"


def via_entry(marker: str) -> bytes:
    """This gateway's `via` entry: `1.1 meshroute-<marker>`."""
    return b"1.1 meshroute-" + marker.encode("ascii")


def came_back(scope: Scope, entry: bytes) -> bool:
    """Whether a request already passed through the gateway whose `via` entry is `entry`."""
    for k, v in scope.get("headers", ()):
        if k == VIA and any(part.strip() == entry for part in v.split(b",")):
            return True
    return False


def add_via(scope: Scope, header: tuple[bytes, bytes]) -> None:
    """Add this gateway's `(VIA, entry)` header to the request's headers, so that it is
    forwarded with the others. A new list: the caller's is never changed (one that reuses
    its scope's headers must not find our marker in its next request)."""
    scope["headers"] = [*scope.get("headers", ()), header]


def is_sse(headers: Iterable[tuple[bytes, bytes]]) -> bool:
    """Whether a response is a Server-Sent Events stream."""
    for k, v in headers:
        if k.lower() == b"content-type":
            return v.startswith(b"text/event-stream")
    return False
