"""RequestGuard: pure ASGI, in front of every endpoint; refuses what a browser page or DNS
rebinding could make the gateway do (docs/security.md, "Browsers and DNS rebinding").

- `Host`: a request whose Host is not an address the connection was accepted on, a name or
  address of this machine, a loopback name or address, nor in `allowed_hosts` is refused with
  421 `invalid_host` on every endpoint (a rebound name points a page's own origin at us; the
  same rule as Django's ALLOWED_HOSTS and Vite's allowedHosts). `*` allows any host,
  `.example.com` the name and its subdomains.
- `Origin`: an unsafe request (not GET, HEAD, OPTIONS), chat included, that carries an Origin
  other than the gateway's own (`http://<Host>`) or one of `allowed_origins` is refused with
  403 `origin_not_allowed`. A browser sends Origin on every cross-origin POST, `no-cors`
  included; non-browser clients send none.
- `Content-Type`: an unsafe request other than chat (chat completions and the other APIs of
  chat/dialects) that carries a Content-Type that is not
  JSON is refused with 403 `invalid_content_type` (a page can send text/plain, a form's
  urlencoded or multipart body without any preflight, never application/json).
A refusal on a dialect's path (`/v1/messages`) leaves in that API's error shape (the
dialects are given to the guard: chat/ sits above http/).
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from starlette.types import ASGIApp, Receive, Scope, Send

from meshroute_middleware.endpoints import DIALECT_PATHS, PATHS, Dialect
from meshroute_middleware.http.errors import HttpError

log = logging.getLogger("meshroute.guard")
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# the routed endpoints (chat, embeddings, completions) and the other APIs over chat
CHAT_PATHS = frozenset({*PATHS.values(), *DIALECT_PATHS})
UNSPECIFIED = frozenset({"", "0.0.0.0", "::"})
LOG_EVERY_S = 1.0
HOST_CACHE = 256  # distinct (Host, local address) verdicts kept; a flood of names resets it
_UNJUDGED = object()


@dataclass(frozen=True, slots=True)
class GuardConfig:
    """Who may reach the gateway from a browser, and under which Host names."""

    allowed_origins: tuple[str, ...] = ()  # exact origins, e.g. http://localhost:3000
    allowed_hosts: tuple[str, ...] = ()  # names beyond ours: `*`, `.example.com`, `gw.lan`
    listen_host: str = "127.0.0.1"  # what the server binds (its own name/address is allowed)
    chat_paths: frozenset[str] = CHAT_PATHS
    # paths with a credential of their own (the mitm relay's one-time ticket): Host rule only
    ticket_paths: frozenset[str] = frozenset()


@functools.lru_cache(maxsize=1)
def machine_names() -> frozenset[str]:
    """This machine's own host names and the addresses they resolve to (best effort; looked
    up once per process)."""
    names = {socket.gethostname(), socket.getfqdn()}
    out = {n.lower().rstrip(".") for n in names if n}
    for name in list(out):
        try:
            infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):
            continue
        out.update(str(info[4][0]).split("%", 1)[0] for info in infos)
    return frozenset(out)


def host_of(value: str) -> str:
    """The host part of a Host header (`name:port`, `[v6]:port`), lower-case, no final dot."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:].split("]", 1)[0]
    if value.count(":") == 1:
        value = value.split(":", 1)[0]
    return value.rstrip(".")


def is_loopback_host(host: str) -> bool:
    """Whether a host (name or address) is loopback: localhost, *.localhost, 127/8, ::1."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def host_matches(pattern: str, host: str) -> bool:
    """Whether `host` (as host_of gives it) matches an allow-list entry: `*`, `.example.com`
    (it and its subdomains) or a name."""
    pattern = pattern.strip().lower().rstrip(".")
    if pattern == "*":
        return True
    if pattern.startswith("."):
        return host == pattern[1:] or host.endswith(pattern)
    return host == host_of(pattern)


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/")
                                            and media.endswith("+json"))


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is refused: the error (its status and code) and a message."""

    error: HttpError
    message: str

    @property
    def status(self) -> int:
        return self.error.status

    @property
    def code(self) -> str:
        return self.error.code


@dataclass(slots=True)
class Policy:
    """The guard's decisions, pure: a request's method, path, headers and local address in,
    a Refusal or None out."""

    config: GuardConfig
    own: frozenset[str] = field(default_factory=machine_names)

    def __post_init__(self) -> None:
        listen = host_of(self.config.listen_host)
        if listen not in UNSPECIFIED:
            self.own = self.own | {listen}

    def host_refusal(self, host_header: str | None, server: str | None) -> Refusal | None:
        """None when the Host names this gateway, else the 421."""
        if host_header is None:  # HTTP/1.0 without Host: no browser sends that
            return None
        host = host_of(host_header)
        if (is_loopback_host(host) or host in self.own
                or (server is not None and host == host_of(server))
                or any(host_matches(p, host) for p in self.config.allowed_hosts)):
            return None
        return Refusal(HttpError.INVALID_HOST, f"the Host {host_header[:100]!r} does not name "
                       "this gateway (add it to --allowed-hosts to serve it under that name)")

    def write_refusal(self, method: str, path: str, origin: str | None,
                      content_type: str | None, host_header: str | None) -> Refusal | None:
        """None when an unsafe request may proceed, else the 403 (Origin, Content-Type)."""
        if method in SAFE_METHODS or path in self.config.ticket_paths:
            return None
        if origin is not None and not self._origin_allowed(origin, host_header):
            return Refusal(HttpError.ORIGIN_NOT_ALLOWED, f"requests from the origin "
                           f"{origin[:100]!r} are not allowed (see --allowed-origins)")
        if (path not in self.config.chat_paths and content_type is not None
                and not _is_json(content_type)):
            return Refusal(HttpError.INVALID_CONTENT_TYPE, "a request that changes the "
                           "gateway must be sent as application/json")
        return None

    def _origin_allowed(self, origin: str, host_header: str | None) -> bool:
        origin = origin.strip().lower().rstrip("/")
        if origin in {o.strip().lower().rstrip("/") for o in self.config.allowed_origins}:
            return True
        if host_header is None:
            return False
        own = host_header.strip().lower()
        return origin in {f"http://{own}", f"https://{own}"}


class RequestGuard:
    """Pure ASGI middleware applying `Policy` to every HTTP request (starlette style);
    `dialects` (path -> Dialect, chat/dialects' DIALECTS) shape refusals on their paths."""

    def __init__(self, app: ASGIApp, config: GuardConfig | None = None, *,
                 reject: Callable[[str, str], None] | None = None,
                 own: Iterable[str] | None = None,
                 dialects: Mapping[str, Dialect] | None = None) -> None:
        self.app = app
        self.dialects: Mapping[str, Dialect] = dialects or {}
        self.policy = (Policy(config or GuardConfig()) if own is None
                       else Policy(config or GuardConfig(), frozenset(own)))
        self.reject = reject  # Telemetry.reject: counted as source="http"
        self._logged_at, self._held = -LOG_EVERY_S, 0
        self._hosts: dict[tuple[str | None, str | None], object] = {}  # -> Refusal | None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        refusal = self.refusal(scope)
        if refusal is None:
            await self.app(scope, receive, send)
            return
        if self.reject is not None:
            self.reject("http", f"{refusal.status} {refusal.code}")
        now = time.monotonic()
        if now - self._logged_at >= LOG_EVERY_S:  # a flood of refusals logs once a second
            log.warning("meshroute: refused %s %r: %s (%d more since the last line)",
                        scope["method"][:16], scope["path"][:100], refusal.message,
                        self._held)
            self._logged_at, self._held = now, 0
        else:
            self._held += 1
        dialect = self.dialects.get(scope["path"]) if scope["method"] == "POST" else None
        if dialect is not None:  # refused in its API's shape (Anthropic's on /v1/messages)
            send = dialect.open(send).send
        await refusal.error.send(send, refusal.message)

    def refusal(self, scope: Scope) -> Refusal | None:
        """The policy's verdict on one request (the headers read in one pass; a Host already
        judged on the same local address is not judged again)."""
        host = origin = content_type = None
        for k, v in scope.get("headers", ()):
            if k == b"host":
                host = v.decode("latin-1")
            elif k == b"origin":
                origin = v.decode("latin-1")
            elif k == b"content-type":
                content_type = v.decode("latin-1")
        server = scope.get("server")
        key = (host, str(server[0]) if server else None)
        refused = self._hosts.get(key, _UNJUDGED)
        if refused is _UNJUDGED:
            refused = self.policy.host_refusal(*key)
            if len(self._hosts) >= HOST_CACHE:
                self._hosts.clear()
            self._hosts[key] = refused
        if refused is not None:
            return refused  # type: ignore[return-value]
        if scope["method"] in SAFE_METHODS:
            return None
        return self.policy.write_refusal(scope["method"], scope["path"], origin,
                                         content_type, host)
