"""Chat requests counted by what their client got, the one definition the dashboard and
`meshroute demo`'s terminal share: answered (a 200 whose stream did not end in an error
event) or failed (any other status, an error event last, or a response never finished).
An attempt that failed and fell back to another route is no failed request."""

from __future__ import annotations

from collections.abc import Callable

from starlette.types import Message, Send

SSE_ERROR = b'data: {"error"'  # core.contracts.error_body.sse_error_event's first bytes
ERROR_TAIL = 512  # an SSE error event is ~150 bytes: it ends within this many


def answered(status: int, tail: bytes) -> bool:
    """Whether a client got an answer: status 200 and the answer's last bytes (a client's
    whole body, or the server's last message) hold no SSE error event."""
    return status == 200 and SSE_ERROR not in tail[-ERROR_TAIL:]


class RequestTally:
    """Answered and failed chat requests since start."""

    __slots__ = ("answered", "failed", "gateway")

    def __init__(self) -> None:
        self.answered = 0
        self.failed = 0
        # the whole gateway's counts where this process is one worker of several
        self.gateway: Callable[[], dict[str, int]] | None = None

    def to_dict(self) -> dict[str, int]:
        """The counts as /v1/routing shows them: the whole gateway's."""
        if self.gateway is not None:
            return self.gateway()
        return self.to_local_dict()

    def to_local_dict(self) -> dict[str, int]:
        """This process's own counts."""
        return {"answered": self.answered, "failed": self.failed}

    def watch(self, send: Send) -> Watch:
        """A `send` for one chat request that counts it by its answer; `close()` it when the
        request's handling ends."""
        return Watch(self, send)


class Watch:
    """The `send` of one chat request, counting it once: at its answer's last message, or
    at `close()` as failed when the answer never ended (aborted, or the client left). One
    slotted object per request, no closure: an open stream keeps few objects alive."""

    __slots__ = ("_send", "_status", "_tally")

    def __init__(self, tally: RequestTally, send: Send) -> None:
        self._tally: RequestTally | None = tally  # None once counted
        self._send, self._status = send, 0

    async def __call__(self, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            self._status = message["status"]
        elif kind == "http.response.body" and not message.get("more_body"):
            tally, self._tally = self._tally, None
            if tally is not None:
                if answered(self._status, message.get("body", b"")):
                    tally.answered += 1
                else:
                    tally.failed += 1
        await self._send(message)

    def forget(self) -> None:
        """Not a request the counts are about (answered without routing: count_tokens)."""
        self._tally = None

    def close(self) -> None:
        """The request's handling ended: an answer that never ended is a failed request."""
        if self._tally is not None:
            self._tally.failed += 1
            self._tally = None
