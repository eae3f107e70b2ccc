"""What a client is told about a chain's attempts: `x-meshroute-route` (`fastco/big-model#2`:
the key's position, never the key), `x-meshroute-attempts`, `x-meshroute-tried`, and
`x-meshroute-clamped` (`max_tokens=4096; asked=32000`) when a mesh model's `clamp` lowered
the request's `max_tokens` (issue 33)."""

from __future__ import annotations

from dataclasses import dataclass

from starlette.types import Message, Send

from meshroute_middleware.chat.attempts import Attempts
from meshroute_middleware.chat.headers import H_ATTEMPTS as H_ATTEMPTS  # its home: headers
from meshroute_middleware.chat.headers import H_ROUTE, OURS

H_TRIED = b"x-meshroute-tried"
H_CLAMPED = b"x-meshroute-clamped"


@dataclass(slots=True)
class Tally:
    """The routes a chain tried, in order, and the one that answered."""

    tried: list[str]
    route: str | None = None
    chain: str = ""  # the model the client asked for (telemetry's `chain`)
    clamped: tuple[int, int | None] | None = None  # (max_tokens sent, max_tokens asked)

    def headers(self) -> list[tuple[bytes, bytes]]:
        route = self.route or (self.tried[-1] if self.tried else "none")
        out = [(H_ROUTE, route.encode()), (H_ATTEMPTS, str(len(self.tried)).encode()),
               (H_TRIED, ",".join(self.tried).encode())]
        if self.clamped is not None:
            out.append((H_CLAMPED, f"max_tokens={self.clamped[0]}; "
                                   f"asked={self.clamped[1]}".encode()))
        return out


class TallySend:
    """The client's send while a chain runs: a mesh entry's own `x-meshroute-*` headers
    replaced by the tally's (its route signature kept), the answer's status noted."""

    __slots__ = ("_send", "_tally", "status")

    def __init__(self, send: Send, tally: Tally) -> None:
        self._send, self._tally = send, tally
        self.status: int | None = None

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message["status"])
            headers = list(message.get("headers", ()))
            route = next((v for k, v in headers if k == H_ROUTE), None)
            if route is not None:  # the mesh route's signature, as the mesh path says it
                self._tally.route = route.decode("latin-1")
            headers = [(k, v) for k, v in headers if not k.lower().startswith(OURS)]
            message = {**message, "headers": headers + self._tally.headers()}
        await self._send(message)


def with_tried(send: Send, attempts: Attempts) -> Send:
    """The mesh path's send, with `x-meshroute-attempts` and `x-meshroute-tried` added (mesh
    route signatures, in order) where the gateway has provider routes too."""
    async def _send(message: Message) -> None:
        if message["type"] == "http.response.start":
            headers = list(message.get("headers", ()))
            tried = [p.route for p in attempts.passed]
            route = next((v.decode("latin-1") for k, v in headers if k == H_ROUTE), None)
            if route is not None and route not in tried:
                tried.append(route)
            headers += [(H_ATTEMPTS, str(len(tried)).encode()),
                        (H_TRIED, ",".join(tried).encode())]
            message = {**message, "headers": headers}
        await send(message)
    return _send
