"""Client keys at the HTTP edge (issue 24): who sends an inference request, and its key taken
out of the request before anything reads it further, so that no node, provider or wrapped
app ever sees it (whatever `--forward-header` allows). docs/security.md, "Client keys"."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable

from starlette.types import Scope

from meshroute_middleware.core.clients import (
    CLIENT_STATE,
    Client,
    InvalidKeyError,
    MissingKeyError,
    check_distinct,
    find_client,
)

__all__ = ["CHALLENGE", "KEY_HEADERS", "ClientAuth", "client_of", "presented_keys"]

log = logging.getLogger("meshroute.middleware")
LOG_EVERY_S = 1.0  # a flood of refused keys logs one line a second, with the count since

# Where a client's key may come: `Authorization: Bearer <key>` (OpenAI's SDKs) or
# `x-api-key: <key>` (Anthropic's). Both leave the request once it is authenticated.
KEY_HEADERS = frozenset({b"authorization", b"x-api-key"})
CHALLENGE = ((b"www-authenticate", b'Bearer realm="meshroute"'),)  # RFC 9110 §11.6.1
_BEARER = b"bearer "
_BEARER_LEN = len(_BEARER)
MAX_PRESENTED = 4  # keys looked at per request, however many header lines carry one


class ClientAuth:
    """The configured clients, and the one check every inference request passes."""

    def __init__(self, clients: Iterable[Client] = (),
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.clients = tuple(clients)
        check_distinct(self.clients)
        self.clock = clock
        self._logged_at, self._held = -LOG_EVERY_S, 0

    @property
    def enabled(self) -> bool:
        """Whether requests need a client key (any client is configured)."""
        return bool(self.clients)

    def authenticate(self, scope: Scope) -> Client | None:
        """The request's client (None when no clients are configured): put in
        scope["state"][CLIENT_STATE], its key headers removed from `scope` (a new list).
        MissingKeyError without a key, InvalidKeyError with a key that is no client's."""
        if not self.clients:
            return None
        kept: list[tuple[bytes, bytes]] = []
        presented = presented_keys(scope.get("headers", ()), kept)
        if not presented:
            raise MissingKeyError("this gateway needs a client key: 'Authorization: Bearer "
                                  "<key>' or 'x-api-key: <key>'")
        found = None
        for key in presented:  # at most one per header line; each checked against all
            client = find_client(self.clients, key)
            found = found or client
        if found is None:
            raise InvalidKeyError("the client key is not valid")
        scope["headers"] = kept
        scope.setdefault("state", {})[CLIENT_STATE] = found
        return found

    def log_refusal(self, path: str, code: str) -> None:
        """Log a 401 by its code (never the key): at most once a second, saying how many
        there were since (someone guessing keys must not flood the log)."""
        now = self.clock()
        if now - self._logged_at < LOG_EVERY_S:
            self._held += 1
            return
        log.warning("meshroute: refused a request to %s: 401 %s (%d more since the last "
                    "line)", path, code, self._held)
        self._logged_at, self._held = now, 0


def client_of(scope: Scope) -> Client | None:
    """The client `ClientAuth.authenticate` found for this request, if any."""
    state = scope.get("state")
    client = state.get(CLIENT_STATE) if isinstance(state, dict) else None
    return client if isinstance(client, Client) else None


def presented_keys(headers: Iterable[tuple[bytes, bytes]],
                   others: list[tuple[bytes, bytes]] | None = None) -> list[bytes]:
    """The keys a request presents: each `Authorization: Bearer` token and `x-api-key`;
    the headers that are no key header go into `others` on the way (one pass)."""
    out = []
    for header in headers:
        name = header[0]
        if name not in KEY_HEADERS:
            if others is not None:
                others.append(header)
            continue
        value = header[1]
        if name == b"x-api-key":
            key = value.strip()
        elif value[:_BEARER_LEN].lower() == _BEARER:
            key = value[_BEARER_LEN:].strip()
        else:
            continue
        if key:
            out.append(key)
    return out[:MAX_PRESENTED]
