"""A real `redis-server` on a loopback port for tests (Debian's package: scripts/ensure-redis)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import redis

from .upstream import free_port

PATIENCE_S = 20.0


class RedisServer:
    """`redis-server --port P --bind 127.0.0.1 --save '' --appendonly no`; stop and start.
    `aof`: `--appendonly yes --appendfsync always` (a kill loses nothing written)."""

    def __init__(self, workdir: Path, port: int | None = None, *, aof: bool = False) -> None:
        binary = shutil.which("redis-server")
        assert binary is not None, "redis-server is not installed: run scripts/ensure-redis"
        self.binary, self.workdir = binary, workdir
        self.port = port or free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen[bytes] | None = None
        self.persistence = ["--appendonly", "yes", "--appendfsync", "always"] if aof else [
            "--appendonly", "no"]

    def start(self) -> RedisServer:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             *self.persistence, "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + PATIENCE_S
        while True:
            try:
                with redis.Redis(port=self.port, socket_timeout=1) as client:
                    client.ping()
                return self
            except redis.exceptions.ConnectionError:
                assert self.proc.poll() is None, "redis-server exited"
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        with socket.socket() as probe:  # the port is free again for a restart
            probe.settimeout(1)
            assert probe.connect_ex(("127.0.0.1", self.port)) != 0


@contextmanager
def redis_server(workdir: Path, *, aof: bool = False) -> Iterator[RedisServer]:
    server = RedisServer(workdir, aof=aof).start()
    try:
        yield server
    finally:
        server.stop()
