"""A real llama.cpp `llama-server` on a loopback port for tests (scripts/ensure-llama-server
builds it and unpacks the SmolLM2-135M GGUF; issue 31).

The binary and model are found from MESHROUTE_LLAMA_SERVER / MESHROUTE_LLAMA_MODEL, else in
the build cache that script uses. Where neither is there the engine tests skip, unless
MESHROUTE_REQUIRE_ENGINES=1 (set by .ci/run), which makes a missing engine a failure.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from ..upstream import free_port

VERSION = "11434.0.0"  # scripts/ensure-llama-server's pin
PATIENCE_S = 120.0  # loading the 93 MB model on a loaded 2-core machine


def cache_dir() -> Path:
    return Path(os.environ.get("MESHROUTE_CACHE", Path.home() / ".cache" / "meshroute"))


def engine_paths() -> tuple[Path, Path] | None:
    """(llama-server, GGUF) when both are present, else None."""
    binary = os.environ.get("MESHROUTE_LLAMA_SERVER")
    model = os.environ.get("MESHROUTE_LLAMA_MODEL")
    bin_path = Path(binary) if binary else cache_dir() / f"llama-server-{VERSION}" / "bin" / \
        "llama-server"
    if model:
        model_path: Path | None = Path(model)
    else:
        found = sorted((cache_dir() / "smollm2").glob("*.gguf"))
        model_path = found[0] if found else None
    if model_path is None or not bin_path.is_file() or not model_path.is_file():
        return None
    return bin_path, model_path


def require_engine() -> tuple[Path, Path]:
    """The engine's paths, or skip (fail under MESHROUTE_REQUIRE_ENGINES=1)."""
    paths = engine_paths()
    if paths is None:
        why = "llama-server is not built: run scripts/ensure-llama-server"
        if os.environ.get("MESHROUTE_REQUIRE_ENGINES") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return paths


class LlamaServer:
    """`llama-server --model GGUF --host 127.0.0.1 --port P --parallel N --threads 1 --metrics
    --slots`; start, wait until /health says ok, kill (as a crash) or stop."""

    def __init__(self, log: Path, parallel: int = 2, ctx_size: int = 8192,
                 extra: tuple[str, ...] = ()) -> None:
        self.binary, self.model = require_engine()
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log, self.parallel, self.ctx_size, self.extra = log, parallel, ctx_size, extra
        self.proc: subprocess.Popen[bytes] | None = None

    def command(self) -> list[str]:
        return [str(self.binary), "--model", str(self.model), "--host", "127.0.0.1",
                "--port", str(self.port), "--parallel", str(self.parallel),
                "--ctx-size", str(self.ctx_size * self.parallel), "--threads", "1",
                "--metrics", "--slots", "--no-webui", *self.extra]

    def start(self) -> LlamaServer:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(self.command(), stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + PATIENCE_S
        while True:
            assert self.proc.poll() is None, \
                f"llama-server exited: {self.log.read_text()[-2000:]}"
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "llama-server did not become healthy"
            time.sleep(0.2)

    def get(self, path: str) -> Any:
        return httpx.get(self.url + path, timeout=10).json()

    def kill(self) -> None:
        """SIGKILL: a crash, mid-stream if a request is running."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
