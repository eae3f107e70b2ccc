"""Misbehaving TCP servers on loopback for fault tests: silent, garbage, closing mid-body."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable

Behaviour = Callable[[socket.socket], None]


def silent(conn: socket.socket) -> None:
    """Accept and read, never answer (until the test ends)."""
    conn.settimeout(30)
    try:
        while conn.recv(65536):
            pass
    except OSError:
        pass


def garbage(conn: socket.socket) -> None:
    """Answer bytes that are not HTTP, then close."""
    conn.recv(65536)
    conn.sendall(b"\x00\xff\xfeNOT HTTP AT ALL\r\n\r\n\x13\x37" * 8)


def closes_mid_body(conn: socket.socket) -> None:
    """A 200 promising 1000 bytes of JSON, 40 of them sent, then the connection closes."""
    conn.recv(65536)
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                 b"content-length: 1000\r\n\r\n" + b'{"id": "c", "object": "chat.completion", ')


def closes_mid_stream(conn: socket.socket) -> None:
    """An SSE stream that closes after two chunks without [DONE]."""
    conn.recv(65536)
    chunk = (b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m",'
             b'"choices":[{"index":0,"delta":{"content":"x "},"finish_reason":null}]}\n\n')
    body = chunk * 2
    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                 b"transfer-encoding: chunked\r\n\r\n"
                 + f"{len(body):x}\r\n".encode() + body + b"\r\n")


class HostileServer:
    """Serves `behaviour` to every connection on a loopback port, in daemon threads."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.connections = 0
        self._conns: list[socket.socket] = []

    def __enter__(self) -> HostileServer:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            self._conns.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self.behaviour(conn)
        except OSError:
            pass
        finally:
            conn.close()

    def __exit__(self, *exc: object) -> None:
        self.sock.close()
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
