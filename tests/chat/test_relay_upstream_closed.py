"""An answer whose connection is found closed mid-read (aiohttp's "Connection closed."
RuntimeError): ForwarderClosed only when the forwarder itself closed under it (the gateway
stops); otherwise the head's connection broke, an upstream failure the relay reports as the
route's (`stream`), and any other RuntimeError is a bug that stays one."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from starlette.types import Message

from meshroute_middleware.chat.relay import relay
from meshroute_middleware.forwarding.client import ForwarderClosed, _AiohttpResponse

pytestmark = pytest.mark.anyio


class _Content:
    """aiohttp's StreamReader as a read sees it: one chunk, then `then` raised."""

    def __init__(self, then: BaseException) -> None:
        self.chunks: list[bytes] = [b"data: {}\n\n"]
        self.then: BaseException | None = then
        self.exception: BaseException | None = None

    async def readany(self) -> bytes:
        if self.exception is not None:
            raise self.exception
        if self.chunks:
            return self.chunks.pop(0)
        assert self.then is not None
        raise self.then

    def set_exception(self, exc: BaseException) -> None:
        self.exception = exc

    def is_eof(self) -> bool:
        return False


class _Raw:
    def __init__(self, then: BaseException) -> None:
        self.content, self.connection = _Content(then), None

    def close(self) -> None:
        pass


def _answer(then: BaseException) -> Any:
    return _AiohttpResponse(200, [], _Raw(then), 30.0)  # type: ignore[arg-type]


async def _relayed(answer: Any) -> tuple[str, list[Message]]:
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    error = await relay(send, answer.chunks(), asyncio.get_running_loop().time() + 60)
    return error, sent


async def test_a_connection_closed_under_a_read_is_the_heads_failure() -> None:
    error, sent = await _relayed(_answer(RuntimeError("Connection closed.")))
    assert error == "stream" and len(sent) == 1  # the route failed mid-stream


async def test_it_is_ours_only_when_the_forwarder_closed() -> None:
    answer = _answer(RuntimeError("Connection closed."))
    answer.cut()  # the forwarder closes (AiohttpForwarder.aclose)
    with pytest.raises(ForwarderClosed):
        await _relayed(answer)
    answer = _answer(RuntimeError("Connection closed."))
    chunks = answer.chunks()
    assert await chunks.__anext__()
    answer.cut_off = True  # closed while aiohttp's read was already failing
    with pytest.raises(ForwarderClosed):
        await chunks.__anext__()


async def test_another_runtime_error_is_no_failure_of_the_head() -> None:
    with pytest.raises(RuntimeError, match="already waiting"):
        await _relayed(_answer(RuntimeError("readany() called while another coroutine is "
                                            "already waiting for incoming data")))
